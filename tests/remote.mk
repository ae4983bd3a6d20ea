# tests/remote.mk — the S3-compatible server the remote tier's suites start on 127.0.0.1
# (tests/check_remote_s3.c): moto's standalone server, from PyPI (moto[server], pinned; no
# Debian package has one), in a venv of its own at build/venv-moto, made by /usr/bin/python3.
# One venv serves every build (build/san and build/tsan too); it is made once and remade
# only when this file (the pin) changes. The suites run it as build/venv-moto/bin/moto_server
# ($MOTO_SERVER names another); without it they say SKIP.

MOTO_VENV := build/venv-moto
MOTO_VERSION := 5.2.1

.PHONY: moto
moto: $(MOTO_VENV)/.ready

$(MOTO_VENV)/.ready: tests/remote.mk | python-deps
	@[ -n "$(Q)" ] && echo "  VENV    $(MOTO_VENV) (moto[server] $(MOTO_VERSION))" || true
	$(Q)rm -rf $(MOTO_VENV)
	$(Q)/usr/bin/python3 -m venv $(MOTO_VENV)
	$(Q)$(MOTO_VENV)/bin/pip install -q --disable-pip-version-check \
		'moto[server]==$(MOTO_VERSION)'
	$(Q)touch $@

# make check runs the suites with the server there.
check-plain: $(MOTO_VENV)/.ready
