module trainyard.dev/kube-stack/ray-dashboard-sim

go 1.26.0
