package console

import (
	"fmt"
	"net/url"
	"strconv"
)

// flashes are the messages a page shows after an action, by the code the
// action's redirect carries in ?done=. The text is the console's own, never
// the link's: a link to a console page cannot make it say anything. An
// unknown code shows nothing. What exactly was done is in the audit the
// page shows below.
var flashes = map[string]string{
	"pause":   "pause: the group is paused (see the audit below)",
	"resume":  "resume: the group is active (see the audit below)",
	"unhalt":  "unhalt: the partition's halt is removed (see the audit below)",
	"reset":   "reset: the group's positions moved (see the audit below)",
	"replay":  "replay: %d done, %d failed (see the audit below)",
	"discard": "discard: %d done, %d failed (see the audit below)",
}

// flashCounted are the codes whose message counts the dead letters done
// and failed, carried as ok= and failed=.
var flashCounted = map[string]bool{"replay": true, "discard": true}

// doneQuery is the query string of the redirect after action code: done,
// and for replay and discard the counts.
func doneQuery(code string, ok, failed int) string {
	q := url.Values{"done": {code}}
	if flashCounted[code] {
		q.Set("ok", strconv.Itoa(ok))
		q.Set("failed", strconv.Itoa(failed))
	}
	return "?" + q.Encode()
}

// flash returns the message of the request's ?done= code, "" for none or
// an unknown one.
func flash(q url.Values) string {
	msg, known := flashes[q.Get("done")]
	if !known {
		return ""
	}
	if !flashCounted[q.Get("done")] {
		return msg
	}
	ok, err1 := strconv.ParseUint(q.Get("ok"), 10, 31)
	failed, err2 := strconv.ParseUint(q.Get("failed"), 10, 31)
	if err1 != nil || err2 != nil {
		return ""
	}
	return fmt.Sprintf(msg, ok, failed)
}
