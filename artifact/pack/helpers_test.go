package pack_test

import (
	"io"

	"github.com/klauspost/compress/gzip"
)

func gunzip(r io.Reader) ([]byte, error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(zr)
}
