# tests/python/python.mk — `make check-python`: the Python binding's tests (tests/python/),
# run with pytest against $(BUILD)/libdsckpt.so and $(BUILD)/dsckptd (real daemons).
#
# Which Python: Debian's /usr/bin/python3, named by path and not taken from PATH (a pyenv or
# conda shim first on PATH has none of the packages). Debian 12 packages PyTorch for it
# (python3-torch: 1.13, CPU), numpy and pytest, so a fresh machine gets them from apt in
# seconds instead of a 700 MB torch wheel from PyPI. safetensors, the independent reader our
# files must satisfy, is not in Debian 12: it comes from PyPI, pinned, into a venv made with
# --system-site-packages under $(BUILD)/pyvenv, which sees Debian's torch/numpy/pytest and
# keeps pip away from the system Python (Debian marks it externally managed, PEP 668).
# python3-matplotlib is for test_plot.py, which draws tests/gpu/plot.py's pictures from small
# synthetic results (the GPU benchmarks' plots; skipped where matplotlib is missing).

PYTHON_DEBIAN_PKGS := python3-torch python3-numpy python3-pytest python3-venv python3-wheel \
	python3-matplotlib
SAFETENSORS_VERSION ?= 0.8.0
PYVENV := $(BUILD)/pyvenv

.PHONY: check-python check-pip python-deps

# Installs the Debian packages that are missing (apt-get; sudo when not root).
python-deps:
	@need=""; for p in $(PYTHON_DEBIAN_PKGS); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || need="$$need $$p"; \
	done; \
	if [ -n "$$need" ]; then \
		sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		echo "installing:$$need"; \
		$$sudo apt-get update -qq && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $$need; \
	fi

# The venv, remade when this file (the pinned version) changes.
$(PYVENV)/.ready: tests/python/python.mk | python-deps
	@[ -n "$(Q)" ] && echo "  VENV    $(PYVENV) (safetensors $(SAFETENSORS_VERSION))" || true
	$(Q)rm -rf $(PYVENV)
	$(Q)/usr/bin/python3 -m venv --system-site-packages $(PYVENV)
	$(Q)$(PYVENV)/bin/pip install -q --disable-pip-version-check \
		safetensors==$(SAFETENSORS_VERSION)
	$(Q)touch $@

check-python: python-deps $(BUILD)/dsckptd $(BUILD)/libdsckpt.so $(PYVENV)/.ready
	@tests/python/run $(BUILD)

# pip install client/python into fresh venvs (build isolation from PyPI, and
# --no-build-isolation with Debian's wheel) and a save and a load through each, with the
# library the package built for itself (tests/python/check-pip says how).
check-pip: python-deps $(BUILD)/dsckptd $(BUILD)/dsckptctl
	@tests/python/check-pip $(BUILD)
