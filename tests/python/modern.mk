# tests/python/modern.mk — `make check-python-modern`: the tests that need a modern PyTorch
# (DCP's async_save, AsyncStager and DTensor: torch >= 2.4), which Debian 12's python3-torch
# (1.13, what `make check-python` uses) is too old for.
#
# Layout:
#   tests/python/modern/requirements.txt   the pins (torch from PyPI, numpy, pytest,
#                                          safetensors; add a package and its pin here)
#   tests/python/modern/test_*.py          the tests; tests/python/conftest.py (the daemons)
#                                          and tests/python/ranks.py (gloo ranks) serve them
#   $(BUILD)/venv-torch                    the venv, made by /usr/bin/python3 (Debian 12's
#                                          3.11; a pyenv or conda shim first on PATH is not
#                                          used) from the pins alone: no system site packages
#
# The venv is made once and reused; it is remade only when requirements.txt changes (its
# stamp, $(BUILD)/venv-torch/.ready, is older then). Making it needs PyPI: PyPI's torch
# wheel is a CUDA build (about 4.7 GB installed) that runs on the CPU; about 2 minutes here.
# pytest prints its summary; tests whose packages are missing are skipped with the reason.

VENV_TORCH := $(BUILD)/venv-torch
MODERN_REQUIREMENTS := tests/python/modern/requirements.txt

.PHONY: check-python-modern

$(VENV_TORCH)/.ready: $(MODERN_REQUIREMENTS) | python-deps
	@[ -n "$(Q)" ] && echo "  VENV    $(VENV_TORCH) ($(MODERN_REQUIREMENTS))" || true
	$(Q)rm -rf $(VENV_TORCH)
	$(Q)/usr/bin/python3 -m venv $(VENV_TORCH)
	$(Q)$(VENV_TORCH)/bin/pip install -q --disable-pip-version-check \
		-r $(MODERN_REQUIREMENTS)
	$(Q)touch $@

check-python-modern: $(BUILD)/dsckptd $(BUILD)/dsckptctl $(BUILD)/libdsckpt.so \
		$(VENV_TORCH)/.ready
	@PYTHON=$(VENV_TORCH)/bin/python tests/python/run $(BUILD) tests/python/modern
