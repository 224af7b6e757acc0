package main

import "fmt"

// A Go program (statically linked by default): `tierstack run` must refuse it up front.
func main() {
	b := make([]byte, 800<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	fmt.Println("ok", len(b))
}
