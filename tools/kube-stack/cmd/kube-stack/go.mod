// The Kubernetes test stack's command: builds the components (in the wrapper modules beside cmd/), starts the
// stack, and runs its checks. Standard library only, so it builds in seconds on a fresh machine
// (scripts/kube-stack builds it on first use).
module trainyard.dev/kube-stack/cmd/kube-stack

go 1.26.0
