// Command vap-status runs upstream's ValidatingAdmissionPolicy status controller
// (k8s.io/kubernetes/pkg/controller/validatingadmissionpolicystatus, the one
// kube-controller-manager runs) against one API server, wired as
// kube-controller-manager wires it: it type-checks every policy's expressions
// against the schemas the server serves and writes status.typeChecking and
// status.observedGeneration. The test harness runs no controller-manager, so the
// admission policy tests start this instead. Test infrastructure only.
//
//	vap-status -kubeconfig FILE
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	apiextensionsscheme "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/scheme"
	validating "k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/cel/openapi/resolver"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	k8sscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/kubernetes/pkg/controller/validatingadmissionpolicystatus"
	"k8s.io/kubernetes/pkg/generated/openapi"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the admin kubeconfig of the API server")
	flag.Parse()
	if err := run(*kubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, "vap-status:", err)
		os.Exit(1)
	}
}

func run(kubeconfig string) error {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	discovery := memory.NewMemCacheClient(client.Discovery())
	schemas := resolver.NewDefinitionsSchemaResolver(
		openapi.GetOpenAPIDefinitions, k8sscheme.Scheme, apiextensionsscheme.Scheme,
	).Combine(&resolver.ClientDiscoveryResolver{Discovery: discovery})
	checker := &validating.TypeChecker{
		SchemaResolver: schemas,
		RestMapper:     restmapper.NewDeferredDiscoveryRESTMapper(discovery),
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	controller, err := validatingadmissionpolicystatus.NewController(
		factory.Admissionregistration().V1().ValidatingAdmissionPolicies(),
		client.AdmissionregistrationV1().ValidatingAdmissionPolicies(),
		checker,
	)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	factory.Start(ctx.Done())
	fmt.Println("vap-status: running")
	controller.Run(ctx, 1)
	return nil
}
