package kafka_test

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/pgevents/pgevents/kafka"
)

// plainAuth is kgo's SASL/PLAIN mechanism for user and pass.
func plainAuth(user, pass string) sasl.Mechanism {
	return plain.Auth{User: user, Pass: pass}.AsMechanism()
}

// saslPlain authenticates the connection with SASL/PLAIN (handshake v1,
// authenticate v2) as user, asking for authorization id authzid, and
// returns the answer's error code.
func (r *rawClient) saslPlain(t *testing.T, authzid, user, pass string) int16 {
	t.Helper()
	hs := kmsg.NewPtrSASLHandshakeRequest()
	hs.SetVersion(1)
	hs.Mechanism = "PLAIN"
	resp, err := r.do(hs)
	if err != nil {
		t.Fatal(err)
	}
	if c := resp.(*kmsg.SASLHandshakeResponse).ErrorCode; c != 0 {
		t.Fatalf("SaslHandshake PLAIN: %v", kerr.ErrorForCode(c))
	}
	au := kmsg.NewPtrSASLAuthenticateRequest()
	au.SetVersion(2)
	au.SASLAuthBytes = []byte(authzid + "\x00" + user + "\x00" + pass)
	resp, err = r.do(au)
	if err != nil {
		t.Fatal(err)
	}
	return resp.(*kmsg.SASLAuthenticateResponse).ErrorCode
}

// TestSASLPlainAuthorizationID: as Kafka's PLAIN server, the endpoint
// takes an empty authorization id or the user's own, and refuses another
// one (a user acting as another) as it refuses a wrong password.
func TestSASLPlainAuthorizationID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1, "", kafka.Options{Users: map[string]string{"alice": "pw", "bob": "pw2"}})
	for _, tc := range []struct {
		authzid, user, pass string
		want                *kerr.Error
	}{
		{"", "alice", "pw", nil},
		{"alice", "alice", "pw", nil},
		{"bob", "alice", "pw", kerr.SaslAuthenticationFailed},
		{"", "alice", "wrong", kerr.SaslAuthenticationFailed},
		{"", "carol", "pw", kerr.SaslAuthenticationFailed},
	} {
		got := kerr.ErrorForCode(dialRaw(t, e.addr).saslPlain(t, tc.authzid, tc.user, tc.pass))
		if got != tc.want && !(got == nil && tc.want == nil) {
			t.Errorf("authzid %q, user %q, password %q: %v, want %v", tc.authzid, tc.user, tc.pass, got, tc.want)
		}
	}
}
