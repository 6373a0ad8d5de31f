# vgpu-state developer entry points. Both targets create .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test test-lowest lint bench fuzz clean cluster image release-check

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[sim]'
	$(BIN)/python -m compileall -q vgpu_state
	touch $@

# With uv (from PyPI, into the venv) as for the demo: seconds where pip takes minutes;
# pip when uv cannot be had.
$(BIN)/.installed-test: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@if $(BIN)/pip install --quiet --disable-pip-version-check uv >/dev/null 2>&1 && \
	    $(BIN)/uv pip install --quiet --python $(BIN)/python -e '.[sim,test]'; then \
	    echo "    installed with uv"; \
	else \
	    echo "    uv unavailable: installing with pip (a few minutes)"; \
	    $(BIN)/pip install --quiet --disable-pip-version-check -e '.[sim,test]'; \
	fi
	$(BIN)/python -m compileall -q vgpu_state
	touch $@ $(BIN)/.installed $(BIN)/.installed-demo

# The demo's packages only: the product, its simulator (mfusepy) and the API server
# emulator its agent part talks to (kmock); not the test toolchain.
$(BIN)/.installed-demo: pyproject.toml
	@echo "==> [1/3] creating $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> [2/3] installing vgpu-state with the simulator and the demo's API server emulator"
	@# uv (from PyPI, into the venv) installs in seconds where pip takes most of a minute;
	@# pip does it when uv cannot be had. Both leave bytecode in site-packages (uv only
	@# with --compile-bytecode): without it every command compiles its imports again
	@# wherever the venv is not writable, 1.5-1.8x the start-up (bench/RESULTS.md).
	@if $(BIN)/pip install --quiet --disable-pip-version-check uv >/dev/null 2>&1 && \
	    $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[demo]'; then \
	    echo "    installed with uv"; \
	else \
	    echo "    uv unavailable: installing with pip (about a minute)"; \
	    $(BIN)/pip install --quiet --disable-pip-version-check -e '.[demo]'; \
	fi
	$(BIN)/python -m compileall -q vgpu_state
	touch $@
	@echo "==> [3/3] running the demo"

demo: $(BIN)/.installed-demo
	$(BIN)/python scripts/demo.py

test: lint
	@sh scripts/ensure-fuse
	@sh scripts/ensure-k8s
	$(BIN)/python -m pytest -q --durations=15

# The other end of every range: the product's own dependencies at the lowest versions
# pyproject.toml allows (uv's lowest-direct resolution; what they pull in, and the test
# tools, which no user installs, at the newest that fit), in .venv-lowest. It runs the
# tests of the code that calls those packages: the Kubernetes adapters, the controller
# and `fleet plan` against the real API server (kubernetes), the device plugin and DRA
# (grpcio, protobuf), the config loader (ruamel.yaml, pydantic), the commands (click,
# rich), metrics (prometheus-client) and the
# webhook's certificates (cryptography). About 3 minutes on 2 cores (bench/RESULTS.md).
LOWEST     := .venv-lowest
LOWEST_BIN := $(LOWEST)/bin
LOWEST_TESTS := \
	tests/test_kube_*.py \
	tests/test_deviceplugin_kubelet.py tests/test_deviceplugin_allocation.py \
	tests/test_deviceplugin_protos.py tests/test_deviceplugin_cli.py \
	tests/test_dra_plugin.py tests/test_dra_protos.py tests/test_kubelet_dra.py \
	tests/test_protos.py \
	tests/test_config_*.py tests/test_cli_*.py \
	tests/test_agent_health.py tests/test_agent_device_plugin.py \
	tests/test_controller_real.py tests/test_fleet_plan.py tests/test_webhook.py

$(LOWEST_BIN)/.installed: pyproject.toml
	rm -rf $(LOWEST)
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST_BIN)/pip install --quiet --disable-pip-version-check uv
	$(LOWEST_BIN)/uv pip compile --quiet --python $(LOWEST_BIN)/python \
	    --resolution lowest-direct --no-header --no-annotate -o $(LOWEST)/lowest.txt pyproject.toml
	$(LOWEST_BIN)/uv pip install --quiet --python $(LOWEST_BIN)/python \
	    -c $(LOWEST)/lowest.txt -e '.[sim,test]'
	touch $@

test-lowest: $(LOWEST_BIN)/.installed
	@sh scripts/ensure-fuse
	@sh scripts/ensure-k8s
	$(LOWEST_BIN)/uv pip list --python $(LOWEST_BIN)/python
	$(LOWEST_BIN)/python -m pytest -q $(LOWEST_TESTS)

lint: $(BIN)/.installed-test
	$(BIN)/ruff check vgpu_state tests scripts bench
	$(BIN)/mypy
	$(BIN)/mypy --strict bench scripts
	$(BIN)/lint-imports

# A real control plane (etcd + kube-apiserver, deploy/ installed) in the foreground, for
# trying the agent and fleet plan by hand: docs/cluster.md. Needs Go (hack/k8s/build.sh).
cluster: $(BIN)/.installed-test
	sh hack/k8s/build.sh
	$(BIN)/python -m tests.realcluster .cluster

# The image of deploy/Dockerfile without a container daemon (buildah, a Debian base from
# debootstrap; as root): build/vgpu-state-<version>.oci.tar, tested by tests/test_image.py.
image:
	sh scripts/build-image

# What a release publishes, built here: the wheel and sdist (uv build), the image (make
# image, as root) and the Helm chart (helm package, with hack/helm's helm or
# $$VGPU_STATE_HELM_BIN/helm), into build/; then one line per artifact with the version
# it carries, and exit 1 unless all are pyproject.toml's (scripts/release_check.py,
# docs/release.md). The release workflow checks the same before it publishes.
HELM ?= $(if $(VGPU_STATE_HELM_BIN),$(VGPU_STATE_HELM_BIN)/helm,hack/helm/bin/helm)
release-check: $(BIN)/.installed
	@test -x "$(HELM)" || { echo "release-check: no helm at $(HELM) (sh hack/helm/build.sh, or set VGPU_STATE_HELM_BIN)" >&2; exit 1; }
	rm -rf build/dist build/chart
	@$(BIN)/uv --version >/dev/null 2>&1 || $(BIN)/pip install --quiet --disable-pip-version-check uv
	$(BIN)/uv build --quiet --out-dir build/dist
	$(MAKE) image
	$(HELM) package deploy/helm/vgpu-state --destination build/chart
	$(BIN)/python scripts/release_check.py --dist build/dist --chart build/chart \
	    --image build/vgpu-state-$$(sh scripts/version).oci.tar

# Many more examples for the fuzz targets of tests/test_fuzz.py (make test runs a short pass).
fuzz: $(BIN)/.installed-test
	VGPU_STATE_FUZZ_EXAMPLES=$${VGPU_STATE_FUZZ_EXAMPLES:-3000} $(BIN)/python -m pytest -q -m fuzz tests/test_fuzz.py

bench: $(BIN)/.installed-test
	for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(LOWEST) .pytest_cache .mypy_cache .ruff_cache .cluster hack/k8s/bin hack/helm/bin hack/promtool/bin hack/actionlint/bin hack/kubevirt/bin
