# The two commands of the README, on a fresh machine:
#   make demo   installs what is missing, builds, and shows TGS at work (on simgpu without a GPU)
#   make test   installs what the tests need too, builds, and runs the whole test suite
PYTHON ?= python3

.PHONY: demo test build clean
demo:
	scripts/bootstrap demo
	$(PYTHON) -m tgs_runtime demo

test:
	scripts/bootstrap test
	$(PYTHON) -m pytest -q

build:
	$(MAKE) -C libshim PYTHON=$(PYTHON)

clean:
	$(MAKE) -C libshim clean
