//go:build race

package tidemark_test

// raceEnabled says the tests run under the race detector, whose runtime
// doubles each goroutine's stack guard and adds to the heap.
const raceEnabled = true
