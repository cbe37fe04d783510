// testplugin: a device plugin written with grpc-go, the kubelet's own gRPC stack.
//
// It exists to prove the harness speaks to plugins as the kubelet does whatever their gRPC
// stack: it refuses any call whose HTTP/2 :authority is not a plain host name (as tonic/h2
// plugins do) and prints each authority it is called with, registers, streams its devices and answers Allocate with one environment
// variable per device. When its socket is deleted (a kubelet restart) it serves and registers
// again, as real plugins do.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// plainHost is what an HTTP/2 stack that validates :authority accepts: host[:port].
var plainHost = regexp.MustCompile(`^[A-Za-z0-9.-]+(:[0-9]+)?$`)

const socketPoll = 100 * time.Millisecond

type testPlugin struct {
	api.UnimplementedDevicePluginServer
	devices []string
}

var (
	seenMu sync.Mutex
	seen   = map[string]bool{}
)

// checkAuthority refuses a call whose :authority is not a plain host, and reports each
// authority it sees for the first time on stdout ("authority <value>").
func checkAuthority(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	got := md.Get(":authority")
	seenMu.Lock()
	for _, a := range got {
		if !seen[a] {
			seen[a] = true
			fmt.Printf("authority %s\n", a)
		}
	}
	seenMu.Unlock()
	if len(got) != 1 || !plainHost.MatchString(got[0]) {
		return status.Errorf(codes.InvalidArgument, "malformed :authority %q", got)
	}
	return nil
}

func (p *testPlugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{}, nil
}

func (p *testPlugin) ListAndWatch(_ *api.Empty, stream api.DevicePlugin_ListAndWatchServer) error {
	resp := &api.ListAndWatchResponse{}
	for _, id := range p.devices {
		resp.Devices = append(resp.Devices, &api.Device{ID: id, Health: api.Healthy})
	}
	if err := stream.Send(resp); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (p *testPlugin) Allocate(_ context.Context, req *api.AllocateRequest) (*api.AllocateResponse, error) {
	resp := &api.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &api.ContainerAllocateResponse{
			Envs: map[string]string{"GO_PLUGIN_DEVICES": strings.Join(c.DevicesIds, ",")}})
	}
	return resp, nil
}

func serveAndRegister(dir, socketName, resource string, plugin *testPlugin) (*grpc.Server, error) {
	socket := filepath.Join(dir, socketName)
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	server := grpc.NewServer(
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := checkAuthority(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := checkAuthority(ss.Context()); err != nil {
				return err
			}
			return h(srv, ss)
		}))
	api.RegisterDevicePluginServer(server, plugin)
	go func() { _ = server.Serve(listener) }()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		server.Stop()
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, err = api.NewRegistrationClient(conn).Register(ctx, &api.RegisterRequest{
		Version: api.Version, Endpoint: socketName, ResourceName: resource, Options: &api.DevicePluginOptions{}})
	if err != nil {
		server.Stop()
		return nil, err
	}
	return server, nil
}

func runTestPlugin(args []string) int {
	fs := flag.NewFlagSet("testplugin", flag.ContinueOnError)
	dir := fs.String("plugin-dir", api.DevicePluginPath, "the kubelet's device-plugin directory")
	resource := fs.String("resource", "", "extended resource name")
	socketName := fs.String("socket-name", "go-testplugin.sock", "socket file name in the plugin directory")
	devices := fs.String("devices", "g0,g1", "comma-separated device ids")
	if err := fs.Parse(args); err != nil || *resource == "" {
		fmt.Fprintln(os.Stderr, "usage: testplugin --resource NAME [--plugin-dir DIR] [--socket-name S] [--devices a,b]")
		return 2
	}
	plugin := &testPlugin{devices: strings.Split(*devices, ",")}
	for {
		server, err := serveAndRegister(*dir, *socketName, *resource, plugin)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testplugin:", err)
			return 1
		}
		fmt.Println("registered")
		for {
			time.Sleep(socketPoll)
			if _, err := os.Stat(filepath.Join(*dir, *socketName)); err != nil {
				break // the kubelet restarted and deleted our socket: serve and register again
			}
		}
		server.Stop()
		for {
			if _, err := os.Stat(filepath.Join(*dir, "kubelet.sock")); err == nil {
				break
			}
			time.Sleep(socketPoll)
		}
	}
}
