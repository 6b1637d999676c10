package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/wire"
)

// rawConn sends requests at the versions the engine pins (wire.Versions)
// and keeps each response's body as the broker wrote it: the bytes the
// engine's decoder reads.
type rawConn struct {
	nc   net.Conn
	fmt  *kmsg.RequestFormatter
	corr int32
}

func dialRaw(ctx context.Context, addr string) (*rawConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &rawConn{nc: nc, fmt: kmsg.NewRequestFormatter(kmsg.FormatterClientID("fuzzcorpus"))}, nil
}

func (c *rawConn) close() { _ = c.nc.Close() }

// do returns the response body after the header, and the response decoded
// from it.
func (c *rawConn) do(req kmsg.Request) ([]byte, kmsg.Response, error) {
	key := kmsg.Key(req.Key())
	v, ok := wire.Versions[key]
	if !ok {
		return nil, nil, fmt.Errorf("%s: not a request the engine sends", key.Name())
	}
	return c.doAt(req, v)
}

// doAt is do at version v: the consumer protocol's (wire.ConsumerProtocolVersions),
// whose responses are flexible; their body keeps the header's tagged fields,
// as the engine's decoder reads them.
func (c *rawConn) doAt(req kmsg.Request, v int16) ([]byte, kmsg.Response, error) {
	key := kmsg.Key(req.Key())
	req.SetVersion(v)
	c.corr++
	_ = c.nc.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.nc.Write(c.fmt.AppendRequest(nil, req, c.corr)); err != nil {
		return nil, nil, fmt.Errorf("sending %s: %w", key.Name(), err)
	}
	var head [8]byte
	if _, err := io.ReadFull(c.nc, head[:]); err != nil {
		return nil, nil, fmt.Errorf("reading the %s response: %w", key.Name(), err)
	}
	size := int32(binary.BigEndian.Uint32(head[:4]))
	if size < 4 || size > 64<<20 {
		return nil, nil, fmt.Errorf("%s response: size %d", key.Name(), size)
	}
	body := make([]byte, size-4)
	if _, err := io.ReadFull(c.nc, body); err != nil {
		return nil, nil, fmt.Errorf("reading the %s response: %w", key.Name(), err)
	}
	res := req.ResponseKind()
	res.SetVersion(v)
	rest := body
	if res.IsFlexible() && key != kmsg.ApiVersions {
		// The header's tagged fields: none of the brokers sends any.
		if len(body) == 0 || body[0] != 0 {
			return nil, nil, fmt.Errorf("%s v%d: a response header with tagged fields, not handled here", key.Name(), v)
		}
		rest = body[1:]
	}
	if err := res.ReadFrom(rest); err != nil {
		return nil, nil, fmt.Errorf("%s response: %w", key.Name(), err)
	}
	return body, res, nil
}

// response sends req, stores the raw response as a FuzzResponses entry
// and returns it decoded.
func (c *capture) response(conn *rawConn, name string, req kmsg.Request) (kmsg.Response, error) {
	body, res, err := conn.do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if err := c.write("internal/wire", "FuzzResponses", name, req.Key(), body); err != nil {
		return nil, err
	}
	return res, nil
}
