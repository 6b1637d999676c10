package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.yaml.in/yaml/v3"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/tidemarktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The parts of a StatefulSet the test reads.
type manifest struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Template struct {
			Spec struct {
				TerminationGracePeriodSeconds *int64      `yaml:"terminationGracePeriodSeconds"`
				Containers                    []container `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
		VolumeClaimTemplates []struct {
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
		} `yaml:"volumeClaimTemplates"`
	} `yaml:"spec"`
}

type container struct {
	Name string `yaml:"name"`
	Env  []struct {
		Name      string  `yaml:"name"`
		Value     *string `yaml:"value"`
		ValueFrom *struct {
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	VolumeMounts   []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type probe struct {
	HTTPGet *struct {
		Path string    `yaml:"path"`
		Port yaml.Node `yaml:"port"` // a number or a port's name
	} `yaml:"httpGet"`
}

// readStatefulSet returns the StatefulSet of statefulset.yaml, a stream
// of documents.
func readStatefulSet(t *testing.T) manifest {
	t.Helper()
	b, err := os.ReadFile("statefulset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(false)
	var sets []manifest
	for {
		var m manifest
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("statefulset.yaml: %v", err)
		}
		if m.Kind == "StatefulSet" {
			sets = append(sets, m)
		}
	}
	if len(sets) != 1 {
		t.Fatalf("statefulset.yaml has %d StatefulSets, want 1", len(sets))
	}
	if n := len(sets[0].Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("the StatefulSet has %d containers, want 1", n)
	}
	return sets[0]
}

// fieldRefValue stands for a downward-API value in the environment the
// test derives from the manifest.
func fieldRefValue(path string) string { return "fieldRef:" + path }

// environment is the container's environment as the manifest sets it,
// each downward-API value replaced by fieldRefValue of its path.
func environment(t *testing.T, c container) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.Value != nil:
			env[e.Name] = *e.Value
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			env[e.Name] = fieldRefValue(e.ValueFrom.FieldRef.FieldPath)
		default:
			t.Errorf("env %s: neither value nor valueFrom.fieldRef", e.Name)
		}
	}
	return env
}

// probePort resolves a probe's port, a number or a container port's name.
func probePort(t *testing.T, c container, n yaml.Node) int {
	t.Helper()
	if p, err := strconv.Atoi(n.Value); err == nil {
		return p
	}
	for _, p := range c.Ports {
		if p.Name == n.Value {
			return p.ContainerPort
		}
	}
	t.Fatalf("probe port %q is not a number nor a port of container %s", n.Value, c.Name)
	return 0
}

// TestManifest checks statefulset.yaml against the program: the Config
// configFromEnv builds from the manifest's environment has InstanceID
// from metadata.name, its offset file on the claimed volume, the status
// server on the probes' port, and a shutdown within the grace period.
func TestManifest(t *testing.T) {
	set := readStatefulSet(t)
	c := set.Spec.Template.Spec.Containers[0]
	cfg, err := configFromEnv(func(k string) string { return environment(t, c)[k] }, handle(zap.NewNop()), nil)
	if err != nil {
		t.Fatalf("configFromEnv on the manifest's environment: %v", err)
	}

	if want := fieldRefValue("metadata.name"); cfg.InstanceID != want {
		t.Errorf("Config.InstanceID = %q, want the pod's name (%s)", cfg.InstanceID, want)
	}

	// The offset file's folder is a volumeClaimTemplate's mount.
	claims := map[string]bool{}
	for _, v := range set.Spec.VolumeClaimTemplates {
		claims[v.Metadata.Name] = true
	}
	dir, mounted := filepath.Dir(cfg.OffsetFile), false
	for _, m := range c.VolumeMounts {
		if filepath.Clean(m.MountPath) == dir {
			mounted = true
			if !claims[m.Name] {
				t.Errorf("the offset file's folder %s is volume %q, not a volumeClaimTemplate (%v)", dir, m.Name, claims)
			}
		}
	}
	if !mounted {
		t.Errorf("the offset file %s is on no volume mount: %+v", cfg.OffsetFile, c.VolumeMounts)
	}

	// The probes' port is the one the status server listens on, on every
	// interface.
	host, port, err := splitAddr(cfg.StatusAddr)
	if err != nil {
		t.Fatalf("Config.StatusAddr %q: %v", cfg.StatusAddr, err)
	}
	if host != "0.0.0.0" && host != "::" {
		t.Errorf("Config.StatusAddr %q listens on %s only: the kubelet's probes would not reach it", cfg.StatusAddr, host)
	}
	for name, p := range map[string]*probe{"livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("no %s.httpGet", name)
			continue
		}
		if got := probePort(t, c, p.HTTPGet.Port); got != port {
			t.Errorf("%s port %d, want %d (Config.StatusAddr %s)", name, got, port, cfg.StatusAddr)
		}
	}

	// The grace period outlasts the shutdown.
	grace := set.Spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil {
		t.Fatal("no terminationGracePeriodSeconds: the default 30 s is not checked against the shutdown")
	}
	if g, b := time.Duration(*grace)*time.Second, shutdownBound(cfg); g <= b {
		t.Errorf("terminationGracePeriodSeconds %s is not above the shutdown bound %s", g, b)
	}
}

func splitAddr(addr string) (string, int, error) {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return "", 0, fmt.Errorf("no port")
	}
	p, err := strconv.Atoi(addr[i+1:])
	return strings.Trim(addr[:i], "[]"), p, err
}

// TestProbes runs the consumer built from the manifest's environment on
// tidemarktest's broker, as the pod "payments-0", and GETs the manifest's
// probe paths from its StatusHandler: each answers 200 once it is ready,
// and a path it does not serve is 404, so a typo in the manifest fails.
func TestProbes(t *testing.T) {
	set := readStatefulSet(t)
	c := set.Spec.Template.Spec.Containers[0]
	b := tidemarktest.NewBroker(t)
	env := environment(t, c)
	env[EnvBrokers] = strings.Join(b.Brokers(), ",")
	env[EnvTopics] = b.CreateTopic(t, env[EnvTopics], 2)
	env[EnvGroup] = b.Name(t, env[EnvGroup])
	env[EnvPodName] = b.Name(t, set.Metadata.Name+"-0")
	env[EnvOffsetDir] = t.TempDir() // the volume's stand-in
	cfg, err := configFromEnv(func(k string) string { return env[k] }, handle(zap.NewNop()), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.StatusAddr = "" // served below on a test server: port 9464 may be taken here
	msgs := b.Produce(t, env[EnvTopics], tidemarktest.Keyed(20, 4)...)

	paths := map[string]string{}
	for name, p := range map[string]*probe{"livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Fatalf("no %s.httpGet", name)
		}
		paths[name] = p.HTTPGet.Path
	}
	paths["a path not served"] = "/not-a-probe"

	codes := map[string]int{}
	var srv *httptest.Server
	defer func() {
		if srv != nil {
			srv.Close()
		}
	}()
	get := func(path string) int {
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Errorf("GET %s: %v", path, err)
			return 0
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	tidemarktest.Run(t, cfg, func(c *framework.Consumer) bool {
		if srv == nil {
			srv = httptest.NewServer(c.StatusHandler())
		}
		if c.Ready() != nil || !tidemarktest.Processed(msgs)(c) {
			return false
		}
		for name, p := range paths {
			codes[name] = get(p)
		}
		return true
	})
	for name, path := range paths {
		want := http.StatusOK
		if path == "/not-a-probe" {
			want = http.StatusNotFound
		}
		if codes[name] != want {
			t.Errorf("%s: GET %s = %d, want %d", name, path, codes[name], want)
		}
	}
}
