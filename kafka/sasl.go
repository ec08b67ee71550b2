package kafka

import (
	"bytes"
	"crypto/subtle"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// saslHandshake accepts the mechanism PLAIN when users are configured.
func (cn *conn) saslHandshake(r *kmsg.SASLHandshakeRequest) kmsg.Response {
	resp := r.ResponseKind().(*kmsg.SASLHandshakeResponse)
	resp.SupportedMechanisms = []string{"PLAIN"}
	if len(cn.s.opts.Users) == 0 || r.Mechanism != "PLAIN" {
		resp.ErrorCode = kerr.UnsupportedSaslMechanism.Code
		return resp
	}
	cn.mech = true
	return resp
}

// saslAuthenticate checks a PLAIN token ("authzid\x00user\x00password");
// a wrong one closes the connection after the answer. As Kafka's PLAIN
// server, it refuses an authorization id other than the user's own (empty
// means the user's): a user cannot act as another.
func (cn *conn) saslAuthenticate(r *kmsg.SASLAuthenticateRequest) (kmsg.Response, error) {
	resp := r.ResponseKind().(*kmsg.SASLAuthenticateResponse)
	if !cn.mech {
		resp.ErrorCode = kerr.IllegalSaslState.Code
		return resp, nil
	}
	parts := bytes.Split(r.SASLAuthBytes, []byte{0})
	ok := false
	msg := "authentication failed: unknown user or wrong password"
	if len(parts) == 3 {
		want, known := cn.s.opts.Users[string(parts[1])]
		ok = known && subtle.ConstantTimeCompare([]byte(want), parts[2]) == 1
		if ok && len(parts[0]) > 0 && !bytes.Equal(parts[0], parts[1]) {
			ok = false
			msg = "authentication failed: the authorization id is not the user's own"
		}
	}
	if !ok {
		resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
		resp.ErrorMessage = &msg
		cn.s.log.Warn().Str("client", cn.c.RemoteAddr().String()).Str("reason", msg).Msg("kafka: SASL/PLAIN authentication failed")
		return resp, nil
	}
	cn.authed = true
	cn.user = string(parts[1])
	return resp, nil
}
