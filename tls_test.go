package tidemark_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// Environment of TestTLS on a real broker (scripts/kafka-local sets both:
// its broker has an SSL listener with a self-signed certificate).
const (
	envTLSBrokers = "KAFKA_TLS_BROKERS" // host:port of the broker's SSL listener
	envTLSCA      = "KAFKA_TLS_CA"      // PEM file of the certificate to trust
)

// selfSigned returns a server certificate for 127.0.0.1 and localhost, and
// a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tidemark test broker"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, pool
}

// tlsBroker returns the address of a broker that speaks only TLS, and a
// client TLS config that trusts it: kfake with kfake.TLS, or the SSL
// listener of the real broker of scripts/kafka-local.
func tlsBroker(t *testing.T) (string, *tls.Config) {
	t.Helper()
	if testsupport.Real() {
		addr, caFile := os.Getenv(envTLSBrokers), os.Getenv(envTLSCA)
		if addr == "" || caFile == "" {
			t.Skipf("%s is set but %s and %s are not: this broker has no TLS listener known to the test (scripts/kafka-local start gives one)",
				testsupport.EnvBrokers, envTLSBrokers, envTLSCA)
		}
		pem, err := os.ReadFile(caFile)
		if err != nil {
			t.Fatalf("%s: %v", envTLSCA, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			t.Fatalf("%s=%s holds no PEM certificate", envTLSCA, caFile)
		}
		return strings.Split(addr, ",")[0], &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	cert, pool := selfSigned(t)
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	return fake.ListenAddrs()[0], &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// TLS end to end, on a listener that speaks only TLS: the consumer's own
// connections (the group's coordinator and heartbeat connections and the
// fetch connections, framework/wire.go) and kafka-go's Client and
// Transport (metadata, offsets, commits) all reach the broker, so every
// message is handled once and committed at the log end; the handshakes are
// counted on the client's side. A consumer without TLS on the same
// listener handles nothing: the listener really refuses plaintext.
func TestTLS(t *testing.T) {
	const parts, perPart = 3, 300
	addr, clientTLS := tlsBroker(t)
	tr := &kafka.Transport{TLS: clientTLS}
	t.Cleanup(tr.CloseIdleConnections)
	admin := &kafka.Client{Addr: kafka.TCP(addr), Transport: tr, Timeout: 20 * time.Second}
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := admin.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: parts, ReplicationFactor: 1}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatalf("creating %s over TLS: %v", topic, err)
	}
	for p := 0; p < parts; p++ {
		for attempt := 1; ; attempt++ {
			// Records are readers, consumed by a send: anew for each attempt.
			var recs []kafka.Record
			for o := 0; o < perPart; o++ {
				recs = append(recs, kafka.Record{Value: kafka.NewBytes(testsupport.Value(p, o))})
			}
			pr, err := admin.Produce(ctx, &kafka.ProduceRequest{Topic: topic, Partition: p, RequiredAcks: kafka.RequireAll,
				Records: kafka.NewRecordReader(recs...)})
			if err == nil {
				err = pr.Error
			}
			if err == nil {
				break
			}
			if attempt == 50 {
				t.Fatalf("producing to %s/%d over TLS: %v", topic, p, err)
			}
			time.Sleep(100 * time.Millisecond) // a new partition's leader may still be elected
		}
	}

	// Plaintext against the TLS listener: nothing gets through.
	plainRec := newRecorder()
	plain, err := framework.New(baseConfig(t, &testsupport.Cluster{Brokers: []string{addr}}, group+"-plain", topic,
		filepath.Join(t.TempDir(), "plain.db"), plainRec))
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 3*time.Second)
	perr := plain.Run(pctx)
	pcancel()
	if n := plainRec.count(); n > 0 {
		t.Fatalf("a consumer without TLS handled %d messages from the TLS listener", n)
	}
	t.Logf("without TLS: nothing handled in 3s (Run: %v)", perr)

	var handshakes atomic.Int64
	cfgTLS := clientTLS.Clone()
	cfgTLS.VerifyConnection = func(tls.ConnectionState) error { handshakes.Add(1); return nil }
	rec := newRecorder()
	cfg := baseConfig(t, &testsupport.Cluster{Brokers: []string{addr}}, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.TLS = cfgTLS
	r := startConsumer(t, cfg)
	waitFor(t, time.Minute, "every message handled and committed over TLS", func() bool {
		ps := r.c.Stats().Partitions
		n := 0
		for _, p := range ps {
			if p.Committed == perPart {
				n++
			}
		}
		return n == parts
	})
	st := r.c.Stats()
	r.stop(t)
	lost, dups := rec.check(parts, offsets(parts, 0), offsets(parts, perPart))
	if len(lost) > 0 || dups > 0 {
		t.Fatalf("over TLS: %d lost (%v), %d handled twice", len(lost), head(lost), dups)
	}
	if bad := rec.badValues(); len(bad) > 0 {
		t.Fatalf("wrong payloads: %v", head(bad))
	}
	// Kafka's committed offsets, read over TLS.
	ids := []int{}
	for p := 0; p < parts; p++ {
		ids = append(ids, p)
	}
	of, err := admin.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		t.Fatalf("reading the committed offsets over TLS: %v", err)
	}
	for _, p := range of.Topics[topic] {
		if p.Error != nil || p.CommittedOffset != perPart {
			t.Errorf("%s/%d: committed %d (%v), want %d", topic, p.Partition, p.CommittedOffset, p.Error, perPart)
		}
	}
	// At least the group's coordinator connection, its heartbeat
	// connection, a fetch connection and kafka-go's Transport.
	if n := handshakes.Load(); n < 4 {
		t.Errorf("%d TLS handshakes by the consumer, want at least 4 (coordinator, heartbeats, fetches, kafka-go's Transport)", n)
	}
	if st.Generation <= 0 {
		t.Errorf("generation %d: the consumer never joined the group", st.Generation)
	}
	t.Logf("over TLS (%s): %d messages handled once, committed at the log end; %d TLS handshakes; generation %d",
		addr, parts*perPart, handshakes.Load(), st.Generation)
}
