package actors

import (
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/proto"
)

func decodeRecord(data []byte) (*keyfoldv1.LogRecord, error) {
	var rec keyfoldv1.LogRecord
	if err := proto.Unmarshal(data, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

func encodeRecord(rec *keyfoldv1.LogRecord) ([]byte, error) {
	return proto.Marshal(rec)
}
