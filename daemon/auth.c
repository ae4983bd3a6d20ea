/*
 * auth.c — who may do what: the one home of the daemon's permission checks.
 *
 * Identity comes from the kernel (SO_PEERCRED at accept) and, for the role, from HELLO; every
 * check fails closed. The checks on paths (a directory below an allowed root, owned by the
 * client's uid) act on descriptors and live with them in store_path.c, called with the uid
 * these checks hand over; a save or commit reaches the disk only as its client's uid/gid.
 */
#include "dsckptd.h"

/* Whether client cl may perform action a; 0, or a negative ERR_E* with err. */
int auth_check(const struct session *cl, enum auth_action a, char *err, size_t errlen)
{
	int role = session_role(cl);

	switch (a) {
	case AUTH_REQUEST:
		if (role == SESSION_NONE)
			return err_set(err, errlen, ERR_ESTATE, "the first message must be HELLO");
		return 0;
	case AUTH_HELLO:
		if (role != SESSION_NONE)
			return err_set(err, errlen, ERR_ESTATE, "HELLO was already sent");
		return 0;
	case AUTH_SAVE:
		if (role != SESSION_TRAINER)
			return err_set(err, errlen, ERR_ESTATE, "only an identified trainer may save");
		return 0;
	case AUTH_COMMIT:
		if (role != SESSION_TRAINER)
			return err_set(err, errlen, ERR_ESTATE,
				       "only an identified trainer may commit");
		return 0;
	case AUTH_SEAL:
		if (role != SESSION_TRAINER)
			return err_set(err, errlen, ERR_ESTATE, "only an identified trainer may seal");
		return 0;
	case AUTH_LOAD:
		if (role == SESSION_NONE)
			return err_set(err, errlen, ERR_ESTATE, "the first message must be HELLO");
		return 0;
	}
	return err_set(err, errlen, ERR_EPERM, "operation not permitted");
}

/* Whether a client of uid viewer may see a save of uid owner: its own; root sees all. */
int auth_sees(uid_t viewer, uid_t owner)
{
	return viewer == 0 || viewer == owner;
}
