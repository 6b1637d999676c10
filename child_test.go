package tidemark_test

// childMain runs this test binary as a child process when the suite asks
// for one (SIGKILL and file-lock scenarios); it reports whether it did.
func childMain() bool { return false }
