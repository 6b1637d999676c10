package tidemarktest_test

import (
	"os"
	"strings"
	"testing"
)

// TestDocsPage checks that the code in docs/your-service.md is the code of
// internal/yourservice, which builds and whose test runs: the page's
// program and test are the first two go blocks, in that order.
func TestDocsPage(t *testing.T) {
	page, err := os.ReadFile("../docs/your-service.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for rest := string(page); ; {
		_, after, ok := strings.Cut(rest, "```go\n")
		if !ok {
			break
		}
		block, after, ok := strings.Cut(after, "```\n")
		if !ok {
			t.Fatal("docs/your-service.md: a go block without its end")
		}
		blocks, rest = append(blocks, block), after
	}
	files := []string{"internal/yourservice/main.go", "internal/yourservice/main_test.go"}
	if len(blocks) != len(files) {
		t.Fatalf("docs/your-service.md has %d go blocks, want %d (%v)", len(blocks), len(files), files)
	}
	for i, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if blocks[i] != string(src) {
			t.Errorf("go block %d of docs/your-service.md differs from %s: copy the file into the page", i+1, f)
		}
	}
}
