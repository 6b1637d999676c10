// Package frameworktest is the part of testsupport that runs a
// framework.Consumer: it imports package framework (only its exported
// API), which testsupport must not, so that framework's white-box tests
// can use testsupport.
//
// Fast and Config give a Config with short intervals, so that rebalances
// and commits happen within seconds (SessionTimeout is the smallest Kafka
// accepts by default). Start and Run run a Consumer on a goroutine of its
// own until Running.Stop or the end of the test; Stop fails the test if
// Run returns an error or does not return within 30s, and Running.Wait
// hands the test the error of a Run that returned by itself.
// CheckInvariant and WatchInvariant assert Kafka committed <= durable <=
// processed; StatsString lays Stats out for a failure message; Status
// serves a path of the consumer's status handler in process.
//
// StartChild runs a consumer in a child process (see Child: a SIGKILL,
// a hard exit on a message, a message stuck in its call); a test binary
// that starts one calls ChildMain first in its TestMain.
package frameworktest
