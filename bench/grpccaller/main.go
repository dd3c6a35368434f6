// Command grpccaller calls a CSI controller's CreateVolume or DeleteVolume over its unix socket at a
// fixed concurrency and times every call, for bench/'s controller section.
//
// It exists because the callers of a CSI controller in a cluster are Go programs (csi-provisioner,
// csi-sanity): a Python gRPC client on the same two cores would charge the driver's figures with
// a caller's cost no real caller pays. Its own CPU is reported beside the figures.
//
// Protocol (one JSON line each way, so cephx secrets never reach a command line):
//
//	stdin  ← {"endpoint","op":"create"|"delete","concurrency","timeout_s","items":[names or volume ids],
//	          "capacity_bytes","parameters","secrets"}
//	stdout → "ready" once connected (one Probe answered), then waits for a "go" line on stdin
//	stdout → {"wall_s","latencies_s","results","errors","cpu_s"}
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

type request struct {
	Endpoint      string            `json:"endpoint"`
	Op            string            `json:"op"`
	Concurrency   int               `json:"concurrency"`
	TimeoutS      float64           `json:"timeout_s"`
	Items         []string          `json:"items"`
	CapacityBytes int64             `json:"capacity_bytes"`
	Parameters    map[string]string `json:"parameters"`
	Secrets       map[string]string `json:"secrets"`
}

type result struct {
	WallS      float64   `json:"wall_s"`
	LatenciesS []float64 `json:"latencies_s"`
	Results    []string  `json:"results"`
	Errors     []string  `json:"errors"`
	CPUS       float64   `json:"cpu_s"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "grpccaller:", err)
		os.Exit(1)
	}
}

func run() error {
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	var req request
	if err := json.Unmarshal(line, &req); err != nil {
		return fmt.Errorf("parsing the request: %w", err)
	}
	if req.Concurrency < 1 || (req.Op != "create" && req.Op != "delete") {
		return fmt.Errorf("want op create or delete and concurrency ≥ 1, got %q and %d", req.Op, req.Concurrency)
	}
	conn, err := grpc.NewClient(req.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dialing %s: %w", req.Endpoint, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err = csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
	cancel()
	if err != nil {
		return fmt.Errorf("probing %s: %w", req.Endpoint, err)
	}
	fmt.Println("ready")
	if _, err := in.ReadString('\n'); err != nil {
		return fmt.Errorf("waiting for go: %w", err)
	}
	cpu0 := cpuSeconds()
	out := calls(csi.NewControllerClient(conn), &req)
	out.CPUS = cpuSeconds() - cpu0
	return json.NewEncoder(os.Stdout).Encode(out)
}

// calls makes one call per item, at most req.Concurrency in flight; the wall time runs from the
// first call to the last answer, as bench/load.py's run_batch measures the Python sides.
func calls(client csi.ControllerClient, req *request) result {
	timeout := time.Duration(req.TimeoutS * float64(time.Second))
	out := result{LatenciesS: []float64{}, Results: []string{}, Errors: []string{}}
	var mu sync.Mutex
	work := make(chan string)
	var wg sync.WaitGroup
	started := time.Now()
	for w := 0; w < req.Concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for item := range work {
				t0 := time.Now()
				answer, err := one(client, req, item, timeout)
				elapsed := time.Since(t0).Seconds()
				mu.Lock()
				if err != nil {
					out.Errors = append(out.Errors, err.Error())
				} else {
					out.LatenciesS = append(out.LatenciesS, elapsed)
					out.Results = append(out.Results, answer)
				}
				mu.Unlock()
			}
		}()
	}
	for _, item := range req.Items {
		work <- item
	}
	close(work)
	wg.Wait()
	out.WallS = time.Since(started).Seconds()
	return out
}

func one(client csi.ControllerClient, req *request, item string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if req.Op == "delete" {
		_, err := client.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: item, Secrets: req.Secrets})
		return item, err
	}
	reply, err := client.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:          item,
		CapacityRange: &csi.CapacityRange{RequiredBytes: req.CapacityBytes},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
		Parameters: req.Parameters,
		Secrets:    req.Secrets,
	})
	if err != nil {
		return "", err
	}
	return reply.GetVolume().GetVolumeId(), nil
}

// cpuSeconds is this process's user+system CPU so far; the difference over the calls is what the
// caller itself cost (start-up and the connection left out, as the driver's side leaves them out).
func cpuSeconds() float64 {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return 0
	}
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano()).Seconds()
}
