package listener

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

type notifyCall struct {
	Topic, Partition int
	MaxOffset        int64
}

func decodeAll(payload string) ([]notifyCall, error) {
	var calls []notifyCall
	err := Decode(payload, func(topic, partition int, maxOffset int64) {
		calls = append(calls, notifyCall{topic, partition, maxOffset})
	})
	return calls, err
}

func TestDecode(t *testing.T) {
	everything := []notifyCall{{0, -1, 0}} // the fallback for an unparsable topic
	tests := []struct {
		name    string
		payload string
		want    []notifyCall
		wantErr bool
	}{
		{name: "one partition", payload: "1:0/5", want: []notifyCall{{1, 0, 5}}},
		{name: "doc example", payload: "3:0/1041,5/1040", want: []notifyCall{{3, 0, 1041}, {3, 5, 1040}}},
		{
			name:    "many partitions",
			payload: "12:0/1,1/22,2/333,1023/9223372036854775807",
			want:    []notifyCall{{12, 0, 1}, {12, 1, 22}, {12, 2, 333}, {12, 1023, 9223372036854775807}},
		},
		{name: "all partitions", payload: "7:*", want: []notifyCall{{7, -1, 0}}},
		{name: "large topic", payload: "2147483647:*", want: []notifyCall{{2147483647, -1, 0}}},

		// The topic cannot be parsed: wake every partition of every topic.
		{name: "empty", payload: "", want: everything, wantErr: true},
		{name: "no colon", payload: "3", want: everything, wantErr: true},
		{name: "bare star", payload: "*", want: everything, wantErr: true},
		{name: "empty topic", payload: ":0/1", want: everything, wantErr: true},
		{name: "text topic", payload: "abc:0/1", want: everything, wantErr: true},
		{name: "spaced topic", payload: " 3:0/1", want: everything, wantErr: true},
		{name: "topic overflow", payload: "99999999999999999999:0/1", want: everything, wantErr: true},
		{name: "garbage", payload: "hello, world", want: everything, wantErr: true},
		{name: "the seed's notify_event", payload: "new_event", want: everything, wantErr: true},

		// The topic is known but a partition item is not: wake every
		// partition of that topic, after the items decoded before it.
		{name: "item without slash", payload: "3:0", want: []notifyCall{{3, -1, 0}}, wantErr: true},
		{name: "text offset", payload: "3:0/x", want: []notifyCall{{3, -1, 0}}, wantErr: true},
		{name: "text partition", payload: "3:a/1", want: []notifyCall{{3, -1, 0}}, wantErr: true},
		{name: "double star", payload: "3:**", want: []notifyCall{{3, -1, 0}}, wantErr: true},
		{name: "star among items", payload: "3:0/1,*", want: []notifyCall{{3, 0, 1}, {3, -1, 0}}, wantErr: true},
		{name: "offset overflow", payload: "3:0/99999999999999999999", want: []notifyCall{{3, -1, 0}}, wantErr: true},
		{name: "bad second item", payload: "3:0/1,bad,2/3", want: []notifyCall{{3, 0, 1}, {3, -1, 0}}, wantErr: true},
		{name: "empty item", payload: "3:0/1,,2/3", want: []notifyCall{{3, 0, 1}, {3, -1, 0}}, wantErr: true},

		// Names no partition at all: wake every partition of the topic
		// rather than nobody.
		{name: "no items", payload: "3:", want: []notifyCall{{3, -1, 0}}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeAll(tt.payload)
			// A payload without a topic number before a colon is not
			// pgevents' own (a seed-style trigger's 'new_event', say): it is
			// told apart, so that it is not logged as a warning each time.
			ts, _, colon := strings.Cut(tt.payload, ":")
			foreign := !colon || strings.Trim(ts, "0123456789") != "" || ts == ""
			if tt.wantErr && errors.Is(err, ErrForeignPayload) != foreign {
				t.Errorf("Decode(%q) error = %v: foreign %v, want %v", tt.payload, err, errors.Is(err, ErrForeignPayload), foreign)
			}
			if (err != nil) != tt.wantErr {
				t.Errorf("Decode(%q) error = %v, want error: %v", tt.payload, err, tt.wantErr)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Decode(%q) calls = %v, want %v", tt.payload, got, tt.want)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		"1:0/5", "3:0/1041,5/1040", "7:*", "", "*", ":", "3", "3:0", "3:0/x",
		"3:0/1,,2/3", "3:0/1,", "-1:-1/-1", "+3:+0/+1", "99999999999999999999:0/1",
		"3:0/99999999999999999999", "3:**", "3:/", "3:0/1/2", "0:0/0",
	} {
		f.Add(s)
	}
	f.Add("3:") // see TestDecode/no_items
	f.Fuzz(func(t *testing.T, payload string) {
		calls, err := decodeAll(payload)
		if len(calls) == 0 {
			t.Fatalf("Decode(%q) called fn zero times (error %v): the payload wakes nobody", payload, err)
		}
		if err != nil {
			// Whatever was decoded before the error, the payload ends with
			// a wake-up of every partition.
			if last := calls[len(calls)-1]; last.Partition != -1 || last.MaxOffset != 0 {
				t.Fatalf("Decode(%q) = %v: last call %v is not a fallback", payload, err, last)
			}
			if !strings.Contains(err.Error(), "bad payload") {
				t.Fatalf("Decode(%q): unexpected error %v", payload, err)
			}
			return
		}
		// Success: every call names the same topic, the payload's.
		for _, c := range calls[1:] {
			if c.Topic != calls[0].Topic {
				t.Fatalf("Decode(%q) = %v: several topics", payload, calls)
			}
		}
	})
}
