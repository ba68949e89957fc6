package main

// deploy-check: checks the deployment manifests in deploy/kubernetes/ against a real API server
// (`scripts/with-kube scripts/kube-deploy-check`):
//
//  1. Every file of kustomization.yaml's `resources` (in that order), then secrets.example.yaml, is applied with
//     server-side apply and --dry-run=server: the API server validates each object (schemas, defaults,
//     admission, Pod Security of the namespace) without storing it. Any refusal fails the check, and so does any
//     warning (a workload that would violate the namespace's Pod Security profile is only a warning for a
//     Deployment). No kustomize is needed: the manifests use none of its transformations.
//  2. The namespace and the RBAC objects are applied for real, because `kubectl auth can-i` answers from the
//     RBAC objects that exist. Then, as the service account (impersonated), every call the Kubernetes backend
//     makes must be allowed, and a list of broader ones (cluster-admin-like, pod creation, exec, node proxy, RBAC
//     writes, reading all Secrets, ...) must be refused. Server-side applies as the service account (dry run)
//     show that an apply that creates an object passes (it is authorized as create and patch).
//
// Step 2 changes the cluster (the namespace, a ServiceAccount, a ClusterRole and its binding), so the check runs
// only against the throwaway stack of scripts/with-kube (TRAINYARD_KUBE_STACK set), unless
// KUBE_DEPLOY_CHECK_REAL_CLUSTER=1 says that applying those objects to the cluster of KUBECONFIG is intended.
//
// kubectl: $TRAINYARD_KUBE_BIN/kubectl, else the newest build in the stack's cache dir
// (${TRAINYARD_KUBE_CACHE:-/var/cache/trainyard/kube-stack}/*/bin), else kubectl on PATH.
// Exit status: 0 when everything passed, 1 when a check failed, 2 when the check could not run.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
)

const (
	manifests        = "deploy/kubernetes"
	deployNamespace  = "trainyard-system"
	deployAccount    = "system:serviceaccount:" + deployNamespace + ":trainyard"
	deployFieldOwner = "trainyard-deploy-check"
)

// Every call of the backend (crates/trainyard-runtime/src/kube/): VERB RESOURCE[.GROUP] [SUBRESOURCE].
var deployAllowed = []string{
	"get pytorchjobs.kubeflow.org", "list pytorchjobs.kubeflow.org", "watch pytorchjobs.kubeflow.org",
	"create pytorchjobs.kubeflow.org", "patch pytorchjobs.kubeflow.org", "delete pytorchjobs.kubeflow.org",
	"get rayjobs.ray.io", "list rayjobs.ray.io", "watch rayjobs.ray.io",
	"create rayjobs.ray.io", "patch rayjobs.ray.io", "delete rayjobs.ray.io",
	"get pods", "list pods", "watch pods", "delete pods", "deletecollection pods",
	"get pods log", "get pods proxy",
	"get nodes", "list nodes", "watch nodes",
	"get namespaces", "list namespaces", "create namespaces", "patch namespaces",
	"get secrets", "create secrets", "patch secrets", "delete secrets",
	"get services", "create services", "patch services", "delete services",
	"get events", "list events", "watch events",
	"get podgroups.scheduling.volcano.sh", "create podgroups.scheduling.volcano.sh",
	"patch podgroups.scheduling.volcano.sh", "delete podgroups.scheduling.volcano.sh",
	"get networkpolicies.networking.k8s.io", "create networkpolicies.networking.k8s.io",
	"patch networkpolicies.networking.k8s.io", "delete networkpolicies.networking.k8s.io",
	"get priorityclasses.scheduling.k8s.io", "create priorityclasses.scheduling.k8s.io",
	"patch priorityclasses.scheduling.k8s.io",
}

// What must stay refused: anything like cluster-admin, running code other than through a job's operator,
// reaching the kubelets, changing RBAC or admission, minting tokens, enumerating every Secret.
var deployRefused = []string{
	"* *", "* pods", "* secrets", "* nodes",
	"create pods", "update pods", "patch pods", "create pods exec", "get pods exec", "create pods attach",
	"create pods portforward", "create pods eviction", "patch pods ephemeralcontainers",
	"list secrets", "watch secrets", "update secrets",
	"update pytorchjobs.kubeflow.org", "update rayjobs.ray.io", "create rayclusters.ray.io",
	"create deployments.apps", "create daemonsets.apps", "create jobs.batch", "create statefulsets.apps",
	"patch nodes", "update nodes", "delete nodes", "get nodes proxy", "create nodes proxy",
	"delete namespaces", "update namespaces", "delete priorityclasses.scheduling.k8s.io",
	"create serviceaccounts", "create serviceaccounts token",
	"create roles.rbac.authorization.k8s.io", "create rolebindings.rbac.authorization.k8s.io",
	"create clusterroles.rbac.authorization.k8s.io", "create clusterrolebindings.rbac.authorization.k8s.io",
	"escalate clusterroles.rbac.authorization.k8s.io", "bind clusterroles.rbac.authorization.k8s.io",
	"impersonate users", "impersonate groups", "impersonate serviceaccounts",
	"create customresourcedefinitions.apiextensions.k8s.io",
	"create mutatingwebhookconfigurations.admissionregistration.k8s.io",
	"create validatingwebhookconfigurations.admissionregistration.k8s.io",
	"update certificatesigningrequests.certificates.k8s.io approval",
}

type deployChecker struct {
	kubectl         []string
	checks, failure int
}

func dsay(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kube-deploy-check: "+format+"\n", args...)
}

// cannotRun: the check could not run (exit code 2).
type cannotRun struct{ msg string }

func (c cannotRun) Error() string { return c.msg }

func deployCheck(root string) int {
	if err := os.Chdir(root); err != nil {
		dsay("%v", err)
		return 2
	}
	d := &deployChecker{}
	if err := d.run(); err != nil {
		dsay("%s", err.Error())
		return 2
	}
	fmt.Printf("kube-deploy-check: %d of %d checks passed\n", d.checks-d.failure, d.checks)
	if d.failure > 0 {
		return 1
	}
	return 0
}

func cannot(format string, args ...any) error { return cannotRun{fmt.Sprintf(format, args...)} }

func (d *deployChecker) pass(what string) {
	d.checks++
	fmt.Printf("ok    %s\n", what)
}

func (d *deployChecker) fail(what, detail string) {
	d.checks++
	d.failure++
	fmt.Printf("FAIL  %s\n", what)
	if detail != "" {
		for _, l := range strings.Split(detail, "\n") {
			fmt.Printf("      %s\n", l)
		}
	}
}

// findKubectl: $TRAINYARD_KUBE_BIN/kubectl, else the newest in the cache's builds, else kubectl on PATH.
func findKubectl() string {
	if bin := os.Getenv("TRAINYARD_KUBE_BIN"); bin != "" && executable(filepath.Join(bin, "kubectl")) {
		return filepath.Join(bin, "kubectl")
	}
	found, _ := filepath.Glob(filepath.Join(cacheRoot(), "*", "bin", "kubectl"))
	newest := ""
	var newestTime int64
	for _, k := range found {
		st, err := os.Stat(k)
		if err != nil || !executable(k) {
			continue
		}
		if newest == "" || st.ModTime().UnixNano() > newestTime {
			newest, newestTime = k, st.ModTime().UnixNano()
		}
	}
	if newest != "" {
		return newest
	}
	k, _ := exec.LookPath("kubectl")
	return k
}

func executable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && syscall.Access(path, 1 /* X_OK */) == nil
}

// kube runs kubectl with stdin; it returns stdout, stderr and the error.
func (d *deployChecker) kube(stdin string, args ...string) (string, string, error) {
	cmd := exec.Command(d.kubectl[0], append(d.kubectl[1:], args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// apply: server-side apply of a file with extra args; its output (stdout and stderr), and whether it passed:
// no refusal and no warning.
func (d *deployChecker) apply(file string, args ...string) (string, bool) {
	cmd := exec.Command(d.kubectl[0], append(append(append(d.kubectl[1:], "apply", "--server-side"), args...), "-f", file)...)
	out, err := cmd.CombinedOutput()
	text := strings.TrimRight(string(out), "\n")
	return text, err == nil && !warning.MatchString(text)
}

var (
	listItem    = regexp.MustCompile(`^ *- `)
	itemPrefix  = regexp.MustCompile(`^ *- *`)
	itemComment = regexp.MustCompile(` *#.*$`)
	warning     = regexp.MustCompile(`(?m)^Warning:`)
	kindLine    = regexp.MustCompile(`(?m)^kind:`)
)

// kustomizationResources: the `resources:` list of a kustomization.yaml (no other kustomize feature is used).
// The list ends at the first line that starts with anything but a space, '#' or '-'.
func kustomizationResources(text string) []string {
	var files []string
	inList := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "resources:") {
			inList = true
			continue
		}
		if inList && l != "" && !strings.ContainsAny(l[:1], " #-") {
			inList = false
		}
		if inList && listItem.MatchString(l) {
			files = append(files, itemComment.ReplaceAllString(itemPrefix.ReplaceAllString(l, ""), ""))
		}
	}
	return files
}

// objectsIn: the objects a file holds (`kind:` at the start of a line, one per document).
func objectsIn(file string) int {
	data, _ := os.ReadFile(file)
	return len(kindLine.FindAllIndex(data, -1))
}

func (d *deployChecker) run() error {
	// ---- kubectl and the cluster
	kubectlBin := findKubectl()
	if kubectlBin == "" {
		return cannot("no kubectl: run under scripts/with-kube (it builds one), or put kubectl on PATH")
	}
	if os.Getenv("KUBECONFIG") == "" && os.Getenv("TRAINYARD_KUBE_STACK") != "" {
		os.Setenv("KUBECONFIG", filepath.Join(os.Getenv("TRAINYARD_KUBE_STACK"), "kubeconfig"))
	}
	kubeconfig := os.Getenv("KUBECONFIG")
	if kubeconfig == "" {
		return cannot("KUBECONFIG is not set: run as scripts/with-kube scripts/kube-deploy-check")
	}
	if os.Getenv("TRAINYARD_KUBE_STACK") == "" && os.Getenv("KUBE_DEPLOY_CHECK_REAL_CLUSTER") != "1" {
		return cannot("not in the test stack (TRAINYARD_KUBE_STACK is unset); this check applies the namespace %s and "+
			"Trainyard's RBAC objects for real. Run it as scripts/with-kube scripts/kube-deploy-check, or set "+
			"KUBE_DEPLOY_CHECK_REAL_CLUSTER=1 to apply them to the cluster of %s.", deployNamespace, kubeconfig)
	}
	d.kubectl = []string{kubectlBin, "--kubeconfig", kubeconfig}
	if _, _, err := d.kube("", "get", "--raw", "/readyz"); err != nil {
		return cannot("the API server of %s is not ready", kubeconfig)
	}
	version, _, _ := d.kube("", "version")
	server := ""
	for _, l := range strings.Split(version, "\n") {
		if v, ok := strings.CutPrefix(l, "Server Version: "); ok {
			server = v
		}
	}
	dsay("kubectl %s server, %s", server, kubectlBin)

	// ---- the files, in the kustomization's order
	kustomization, err := os.ReadFile(manifests + "/kustomization.yaml")
	if err != nil {
		return cannot("%v", err)
	}
	var files []string
	for _, f := range kustomizationResources(string(kustomization)) {
		files = append(files, manifests+"/"+f)
	}
	if len(files) == 0 {
		return cannot("no resources listed in %s/kustomization.yaml", manifests)
	}
	// Kept out of the kustomization on purpose, but it must be valid too.
	files = append(files, manifests+"/secrets.example.yaml")
	for _, f := range files {
		if st, err := os.Stat(f); err != nil || !st.Mode().IsRegular() {
			return cannot("%s (listed in kustomization.yaml) does not exist", f)
		}
	}
	// Every manifest here must be reached by this check.
	all, _ := filepath.Glob(manifests + "/*.yaml")
	for _, f := range all {
		if strings.HasSuffix(f, "/kustomization.yaml") {
			continue
		}
		listed := false
		for _, g := range files {
			listed = listed || f == g
		}
		if !listed {
			d.fail(f+" is neither in kustomization.yaml nor secrets.example.yaml", "")
		}
	}

	// ---- 1. server-side dry run of every file. Namespaced objects need their namespace to exist, so after its
	// own dry run the namespace is applied for real.
	for _, f := range files {
		want := objectsIn(f)
		if out, ok := d.apply(f, "--dry-run=server", "--field-manager="+deployFieldOwner); ok {
			got := strings.Count(out, "serverside-applied (server dry run)")
			if got == want {
				d.pass(fmt.Sprintf("dry run: %s (%d object(s) accepted)", f, got))
			} else {
				d.fail(fmt.Sprintf("dry run: %s: %d of %d object(s) reported as applied", f, got, want), out)
			}
		} else {
			d.fail(fmt.Sprintf("dry run: %s refused or warned", f), out)
		}
		if f == manifests+"/namespace.yaml" {
			if out, ok := d.apply(f); !ok {
				return cannot("creating the namespace failed: %s", out)
			}
		}
	}

	// ---- 2. RBAC, for real, then ask the API server about the service account.
	if out, ok := d.apply(manifests + "/rbac.yaml"); !ok {
		return cannot("applying rbac.yaml failed: %s", out)
	}
	for _, c := range deployAllowed {
		if answer := d.can(c); answer == "yes" {
			d.pass("can " + c)
		} else {
			d.fail(fmt.Sprintf("can %s: the API server says '%s'", c, answer), "")
		}
	}
	for _, c := range deployRefused {
		if answer := d.can(c); answer == "no" {
			d.pass("cannot " + c)
		} else {
			d.fail(fmt.Sprintf("cannot %s: the API server says '%s'", c, answer), "")
		}
	}

	// ---- applies as the service account (dry run): an apply that creates the object must pass. The job kinds
	// are tried when the cluster serves them (the test stack does, with the operators' own CRDs).
	d.asAccount("a new Namespace", `apiVersion: v1
kind: Namespace
metadata:
  name: trainyard-deploy-check
  labels: {app.kubernetes.io/managed-by: trainyard}
`)
	d.asAccount("a Secret", `apiVersion: v1
kind: Secret
metadata: {name: deploy-check, namespace: `+deployNamespace+`}
stringData: {key: value}
`)
	d.asAccount("a Service", `apiVersion: v1
kind: Service
metadata: {name: deploy-check, namespace: `+deployNamespace+`}
spec:
  clusterIP: None
  selector: {app: deploy-check}
  ports: [{name: precheck, port: 29500}]
`)
	if d.serves("kubeflow.org", "pytorchjobs.kubeflow.org") {
		d.asAccount("a PyTorchJob", `apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: deploy-check, namespace: `+deployNamespace+`}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers: [{name: pytorch, image: registry.invalid/pytorch:latest}]
`)
	} else {
		dsay("the cluster serves no PyTorchJob: its apply as the service account is not tried")
	}
	if d.serves("ray.io", "rayjobs.ray.io") {
		d.asAccount("a RayJob", `apiVersion: ray.io/v1
kind: RayJob
metadata: {name: deploy-check, namespace: `+deployNamespace+`}
spec:
  entrypoint: python -c pass
  rayClusterSpec:
    headGroupSpec:
      rayStartParams: {}
      template:
        spec:
          containers: [{name: ray-head, image: registry.invalid/ray:latest}]
`)
	} else {
		dsay("the cluster serves no RayJob: its apply as the service account is not tried")
	}
	// And one it must not be able to make.
	tmp, err := tempManifest(`apiVersion: v1
kind: Pod
metadata: {name: deploy-check, namespace: ` + deployNamespace + `}
spec:
  containers: [{name: c, image: registry.invalid/c:latest}]
`)
	if err != nil {
		return cannot("%v", err)
	}
	defer os.Remove(tmp)
	cmd := exec.Command(d.kubectl[0], append(d.kubectl[1:], "apply", "--server-side", "--dry-run=server",
		"--field-manager=trainyard", "--as="+deployAccount, "-f", tmp)...)
	out, err := cmd.CombinedOutput()
	text := strings.TrimRight(string(out), "\n")
	if err != nil && (strings.Contains(text, "Forbidden") || strings.Contains(text, "forbidden")) {
		d.pass("apply of a Pod as the service account is forbidden")
	} else {
		d.fail("apply of a Pod as the service account should be forbidden", text)
	}
	return nil
}

func tempManifest(text string) (string, error) {
	f, err := os.CreateTemp("", "kube-deploy-check.*.yaml")
	if err != nil {
		return "", err
	}
	defer f.Close()
	_, err = f.WriteString(text)
	return f.Name(), err
}

// asAccount: a server-side apply (dry run) as the service account must pass.
func (d *deployChecker) asAccount(name, manifest string) {
	tmp, err := tempManifest(manifest)
	if err != nil {
		d.fail("apply as the service account (dry run): "+name, err.Error())
		return
	}
	defer os.Remove(tmp)
	if out, ok := d.apply(tmp, "--dry-run=server", "--field-manager=trainyard", "--as="+deployAccount); ok {
		d.pass("apply as the service account (dry run): " + name)
	} else {
		d.fail("apply as the service account (dry run): "+name, out)
	}
}

// serves: whether the cluster serves a resource ("<plural>.<group>") of an API group.
func (d *deployChecker) serves(group, resource string) bool {
	out, _, err := d.kube("", "api-resources", "--api-group="+group, "-o", "name")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(out, "\n") {
		if l == resource {
			return true
		}
	}
	return false
}

// can: "yes" or "no", whether the service account may "VERB RESOURCE[.GROUP] [SUBRESOURCE]" in every namespace.
func (d *deployChecker) can(check string) string {
	f := strings.Fields(check)
	verb, resource, sub := f[0], f[1], ""
	if len(f) > 2 {
		sub = f[2]
	}
	group := ""
	if i := strings.Index(resource, "."); i >= 0 {
		group = resource[i+1:]
	}
	if group == "" || d.serves(group, resource) {
		args := []string{"auth", "can-i", verb, resource}
		if sub != "" {
			args = append(args, "--subresource="+sub)
		}
		out, _, _ := d.kube("", append(args, "--all-namespaces", "--as="+deployAccount)...)
		return strings.TrimRight(out, "\n")
	}
	// A resource the cluster does not serve (Volcano's podgroups in the test stack): `kubectl auth can-i` cannot
	// resolve its group and would ask about the wrong resource, so the question goes to the API server as a
	// SubjectAccessReview with the group spelled out (RBAC answers for resources that do not exist too). The
	// groups are the ones every service account token carries.
	out, _, err := d.kube(fmt.Sprintf(`apiVersion: authorization.k8s.io/v1
kind: SubjectAccessReview
spec:
  user: %s
  groups: [system:serviceaccounts, "system:serviceaccounts:%s", system:authenticated]
  resourceAttributes: {verb: "%s", group: "%s", resource: "%s", subresource: "%s"}
`, deployAccount, deployNamespace, verb, group, strings.SplitN(resource, ".", 2)[0], sub),
		"create", "-o", "jsonpath={.status.allowed}", "-f", "-")
	if err != nil {
		return "error"
	}
	switch out = strings.TrimRight(out, "\n"); out {
	case "true":
		return "yes"
	case "false":
		return "no"
	}
	return out
}
