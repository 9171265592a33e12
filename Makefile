# ballast — run `make help` for the targets.
SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help

CLUSTER_DIR ?= $(CURDIR)/.cluster
KUBECTL     ?= $(CLUSTER_DIR)/bin/kubectl --kubeconfig $(CLUSTER_DIR)/kubeconfig
CARGO       ?= cargo
# The revision gate's objects (config/admission): removed before the CRDs they take params from.
ADMISSION_KINDS  := mutatingadmissionpolicybindings,mutatingadmissionpolicies,validatingadmissionpolicybindings,validatingadmissionpolicies
ADMISSION_LABELS := app.kubernetes.io/part-of=ballast,app.kubernetes.io/component=admission

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

##@ Development

.PHONY: generate
generate: ## Write the CRDs into crds/ (crdgen)
	$(CARGO) run --quiet --bin crdgen -- crds

.PHONY: build
build: ## Build the manager and crdgen (release)
	$(CARGO) build --release --bins

.PHONY: lint
lint: ## cargo fmt --check and clippy -D warnings
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

.PHONY: test
test: ## Build what is missing, start the local cluster, run every test, stop the cluster
	hack/test.sh

.PHONY: bench
bench: ## Run the benchmarks that need no cluster
	$(CARGO) bench --bench spread_plan
	$(CARGO) bench --bench cache_cost

# The cluster benchmarks, in this order: each runs even when one before it failed, and the target
# fails if any did. `make bench-cluster CLUSTER_BENCHES=cluster_spread` runs one of them.
# cluster_rollout last: the last bench waits for its cleanup, and its cleanup is the shortest.
CLUSTER_BENCHES ?= cluster_spread cluster_scheduler cluster_admission cluster_rollout

# The cluster is the one hack/test.sh uses (BALLAST_CLUSTER_DIR, else .cluster/). Each bench
# starts on that cluster started afresh (stopped, its state removed, started again; about 30 s):
# an API server and an etcd that earlier benches or tests loaded answer more slowly (P5's p99 at
# 160 ms, then 323 ms on the same code right after the fault suite had loaded that cluster), so a
# bench's numbers would depend on what ran before it. BENCH_FRESH=0 keeps the cluster as it is.
# cluster_admission runs during cluster_spread's P2 (ten minutes of churn that only counts
# requests) on its cluster, and the other benches build meanwhile: hack/bench-cluster.sh says
# why and how; BENCH_BESIDE_P2=0 runs each bench alone.
# The cluster stays up afterwards. On fresh clusters a bench but the last does not wait for its
# last cleanup (BALLAST_BENCH_CLEANUP=background; benches/support/mod.rs, `Deletion`): the next
# start wipes it. The last one waits, so the cluster it leaves up is clean for `make test`.
BENCH_FRESH ?= 1
BENCH_BESIDE_P2 ?= 1
.PHONY: bench-cluster
bench-cluster: ## Cluster benchmarks on the local control plane started afresh (hack/bench-cluster.sh)
	CARGO="$(CARGO)" CLUSTER_BENCHES="$(CLUSTER_BENCHES)" BENCH_FRESH="$(BENCH_FRESH)" \
	  BENCH_BESIDE_P2="$(BENCH_BESIDE_P2)" BALLAST_CLUSTER_DIR="$${BALLAST_CLUSTER_DIR:-$(CLUSTER_DIR)}" \
	  hack/bench-cluster.sh

.PHONY: bench-plots
bench-plots: ## Draw docs/performance/*.svg from the newest results in bench/results/
	$(CARGO) bench --bench plots

.PHONY: install-plugin
install-plugin: ## Install the kubectl plugin (kubectl ballast) into ~/.cargo/bin
	$(CARGO) install --path . --bin kubectl-ballast --locked

.PHONY: run
run: ## Run the operator on the local cluster with the examples applied
	hack/run.sh

##@ Packaging (images, installer, Helm chart)

.PHONY: image
image: ## Build the manager's OCI image without a daemon (umoci) into dist/; IMG=registry/name:tag also pushes it
	hack/build-image.sh

.PHONY: image-check
image-check: ## Build the image twice from one binary and fail unless the digests match (make image first)
	hack/build-image.sh --no-build --out target/image-check/1 >/dev/null
	hack/build-image.sh --no-build --out target/image-check/2 >/dev/null
	@a="$$(cat target/image-check/1/*.digest)"; b="$$(cat target/image-check/2/*.digest)"; \
	  echo "image-check: $$a / $$b"; [ "$$a" = "$$b" ]

.PHONY: installer
installer: ## Write dist/install.yaml: config/default in one file, the image pinned by digest (DIGEST=, IMG=)
	hack/installer.sh

.PHONY: helm-build
helm-build: ## Build helm (v4, from its Go module; cached in ~/.cache/ballast)
	hack/build-tool.sh helm >/dev/null

.PHONY: helm-lint
helm-lint: helm-build ## helm lint charts/ballast
	"$$(hack/build-tool.sh helm 2>/dev/null)" lint charts/ballast

##@ Local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)

.PHONY: cluster-build
cluster-build: ## Build the control plane binaries (cached in ~/.cache/ballast)
	hack/build-cluster.sh

.PHONY: cluster-up
cluster-up: cluster-build ## Start the local cluster (a no-op when it is up)
	hack/cluster-up.sh

.PHONY: cluster-down
cluster-down: ## Stop the local cluster and remove its state
	hack/cluster-down.sh

##@ Deployment (against the current kubectl context)

.PHONY: install
install: ## Install the CRDs only
	kubectl apply --server-side -k config/crd

.PHONY: deploy
deploy: ## Install CRDs, RBAC and the manager (kubectl apply -k config/default)
	kubectl apply --server-side -k config/default

.PHONY: undeploy
undeploy: ## Remove what deploy installed: the CRs first (the running manager releases their workloads), the admission gate, then the rest
	kubectl delete rolloutstrategies.ballast.dev,spreadpolicies.ballast.dev,clusterspreadpolicies.ballast.dev --all --all-namespaces --ignore-not-found --wait --timeout=180s
	kubectl delete $(ADMISSION_KINDS) -l $(ADMISSION_LABELS) --ignore-not-found
	kubectl delete -k config/default --ignore-not-found
