// akrihandler: a discovery handler written to Akri's protocol, in Go, for edgeplug's tests.
//
// It stands for an Akri user's custom handler (or Akri's own debugEcho): it finds the agent
// through DISCOVERY_HANDLERS_DIRECTORY, registers over agent-registration.sock, serves
// DiscoveryHandler on its own socket in that directory (or on a TCP port, as a NETWORK
// endpoint like a handler in a pod) and, like Akri's handlers, registers again whenever the
// agent drops a Discover stream.
//
// Details (YAML, a superset of debugEcho's):
//
//	descriptions: [foo0, foo1]  # one device per description; id = description
//	deviceNodes: true           # each device gets a device spec /dev/akri/<desc> <- /dev/null
//	malformed: true             # also send a device with no id and one whose spec has no host path
//	fail: true                  # answer Discover with INVALID_ARGUMENT instead
//
// Each device carries DEBUG_ECHO_DESCRIPTION and, for every discovery property, its name and
// the SHA-256 of its bytes (never the value), so a test can see the properties arrived.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"log"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	v0 "edgeplug.io/tests/akrihandler/v0"
)

const (
	registrationSocket = "agent-registration.sock"
	registerRetry      = 200 * time.Millisecond
	registerDeadline   = 30 * time.Second
)

type details struct {
	Descriptions []string `yaml:"descriptions"`
	DeviceNodes  bool     `yaml:"deviceNodes"`
	Malformed    bool     `yaml:"malformed"`
	Fail         bool     `yaml:"fail"`
}

type handler struct {
	v0.UnimplementedDiscoveryHandlerServer
	dropped chan struct{} // a Discover stream ended: register again, as Akri's handlers do
}

func (h *handler) Discover(req *v0.DiscoverRequest, stream v0.DiscoveryHandler_DiscoverServer) error {
	var d details
	if err := yaml.Unmarshal([]byte(req.DiscoveryDetails), &d); err != nil {
		return status.Errorf(codes.InvalidArgument, "discoveryDetails: %v", err)
	}
	log.Printf("discover called: %v", d.Descriptions)
	if d.Fail {
		return status.Error(codes.InvalidArgument, "discoveryDetails asks this handler to fail")
	}
	devices := []*v0.Device{}
	for _, desc := range d.Descriptions {
		props := map[string]string{"DEBUG_ECHO_DESCRIPTION": desc}
		names := []string{}
		for name, value := range req.DiscoveryProperties {
			sum := sha256.Sum256(value.GetVec())
			props["PROPERTY_SHA256_"+strings.ToUpper(name)] = hex.EncodeToString(sum[:8])
			names = append(names, name)
		}
		sort.Strings(names)
		props["PROPERTY_NAMES"] = strings.Join(names, ",")
		device := &v0.Device{Id: desc, Properties: props}
		if d.DeviceNodes {
			device.DeviceSpecs = []*v0.DeviceSpec{{
				ContainerPath: "/dev/akri/" + desc, HostPath: "/dev/null", Permissions: "rw",
			}}
			device.Mounts = []*v0.Mount{{
				ContainerPath: "/etc/akri/" + desc, HostPath: "/etc/hostname", ReadOnly: true,
			}}
		}
		devices = append(devices, device)
	}
	if d.Malformed {
		devices = append(devices,
			&v0.Device{Id: "", Properties: map[string]string{"DEBUG_ECHO_DESCRIPTION": "no-id"}},
			&v0.Device{Id: "no-host-path", DeviceSpecs: []*v0.DeviceSpec{{ContainerPath: "/dev/x"}}},
		)
	}
	if err := stream.Send(&v0.DiscoverResponse{Devices: devices}); err != nil {
		return err
	}
	<-stream.Context().Done() // the list never changes: hold the stream until the agent goes
	select {
	case h.dropped <- struct{}{}:
	default:
	}
	return nil
}

func register(dir string, req *v0.RegisterDiscoveryHandlerRequest) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, registrationSocket),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	deadline := time.Now().Add(registerDeadline)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = v0.NewRegistrationClient(conn).RegisterDiscoveryHandler(ctx, req)
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(registerRetry)
	}
}

func main() {
	name := flag.String("name", "debugEcho", "the name to register under")
	shared := flag.Bool("shared", true, "register as a handler of shared devices")
	network := flag.Bool("network", false, "serve on 127.0.0.1:<free port> (NETWORK) instead of a socket")
	flag.Parse()
	dir := os.Getenv("DISCOVERY_HANDLERS_DIRECTORY")
	if dir == "" {
		log.Fatal("DISCOVERY_HANDLERS_DIRECTORY is not set")
	}
	req := &v0.RegisterDiscoveryHandlerRequest{Name: *name, Shared: *shared}
	var lis net.Listener
	var err error
	if *network {
		lis, err = net.Listen("tcp", "127.0.0.1:0")
		req.EndpointType = v0.RegisterDiscoveryHandlerRequest_NETWORK
		req.Endpoint = "http://" + lis.Addr().String() // as Akri's handlers in pods register
	} else {
		path := filepath.Join(dir, *name+".sock")
		_ = os.Remove(path) // a previous run's socket
		lis, err = net.Listen("unix", path)
		req.EndpointType = v0.RegisterDiscoveryHandlerRequest_UDS
		req.Endpoint = path
	}
	if err != nil {
		log.Fatalf("listen: %v", err)
	}
	h := &handler{dropped: make(chan struct{}, 1)}
	server := grpc.NewServer()
	v0.RegisterDiscoveryHandlerServer(server, h)
	go func() {
		if err := server.Serve(lis); err != nil {
			log.Fatalf("serve: %v", err)
		}
	}()
	if err := register(dir, req); err != nil {
		log.Fatalf("register: %v", err)
	}
	log.Printf("registered %q at %s", req.Name, req.Endpoint)
	for range h.dropped {
		if err := register(dir, req); err != nil {
			log.Printf("registering again: %v", err)
		} else {
			log.Printf("registered %q at %s again", req.Name, req.Endpoint)
		}
	}
}
