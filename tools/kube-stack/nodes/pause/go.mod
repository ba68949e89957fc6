// The real nodes' pause (sandbox) image's only binary: ours, standard library only, built static.
module trainyard.dev/kube-stack/nodes/pause

go 1.26.0
