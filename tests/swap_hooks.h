/* swap_hooks.h — stopping a process before the n-th change it makes to a tree (swap_hooks.c). */
#ifndef DSCKPT_SWAP_HOOKS_H
#define DSCKPT_SWAP_HOOKS_H

/* Arms the hooks: the at-th tree-changing call from now on SIGKILLs the process instead of
 * happening (0 disarms). */
void swap_hooks_arm(unsigned at);
/* Tree-changing calls made since arming. */
unsigned swap_hooks_calls(void);

#endif
