package kafkaproxy_test

import (
	"errors"
	"net"
	"syscall"
)

var errConnReset = syscall.ECONNRESET

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
