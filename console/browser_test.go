package console_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/pgevents/pgevents/console"
)

// EnvChromium names the environment variable that gives the browser's
// path; otherwise chromium (Debian's package), chromium-browser or
// google-chrome on the PATH.
const EnvChromium = "PGEVENTS_CHROMIUM"

// EnvScreenshots names a directory where the browser test saves a
// screenshot of each page it visits.
const EnvScreenshots = "PGEVENTS_CONSOLE_SCREENSHOTS"

// chromium returns the browser's path, or fails the test saying how to
// install it: a browser test that cannot run is a broken setup, not a skip.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(EnvChromium); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatalf("no browser for the console's browser test: install Debian's chromium (sudo apt-get install -y chromium; .ci/run does) "+
		"or set %s to a Chromium or Chrome executable", EnvChromium)
	return ""
}

// browser starts a headless Chromium for the test, with nothing that
// reaches the network by itself, and returns its context.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless,
		chromedp.NoSandbox, // as root in containers
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(func() {
		cancelTimeout()
		cancelCtx()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", chromium(t), err)
	}
	return ctx
}

// dialogs records the JavaScript dialogs a page opens, accepting each
// (the console asks confirm() before a discard).
type dialogs struct {
	mu   sync.Mutex
	seen []string // "type: message"
}

func (d *dialogs) listen(ctx context.Context) {
	evs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range evs {
			if err != nil {
				return
			}
			d.mu.Lock()
			d.seen = append(d.seen, string(ev.Type)+": "+ev.Message)
			d.mu.Unlock()
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
}

func (d *dialogs) of(kind string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, s := range d.seen {
		if strings.HasPrefix(s, kind+":") {
			out = append(out, s)
		}
	}
	return out
}

// shot saves a screenshot of the page as name.png under EnvScreenshots.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv(EnvScreenshots)
	if dir == "" {
		return
	}
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), buf, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBrowser drives the console in Chromium: sign-in through the form;
// an event whose payload is <script>alert(1)</script> shown as text, with
// no alert; pause by its button; a reset previewed (the number of events
// replayed as the database counts them) and confirmed (the positions
// where it said); a live figure that changes without a reload; a discard
// confirmed in a dialog; every page visited, none opening an alert.
func TestBrowser(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, console.Options{})
	dl := e.fixture()
	e.restart(console.Options{Resolvers: resolverFor(t, e, 2)})
	script := e.appendTx(ev("<img src=x onerror=alert(2)>", "evil", `{"note":"<script>alert(1)</script>"}`))[0]
	var scriptPartition int
	if err := e.pool.QueryRow(e.ctx, `SELECT partition_id FROM outbox_message_t WHERE c_offset = $1 AND event_type = 'evil'`, script).Scan(&scriptPartition); err != nil {
		t.Fatal(err)
	}
	e.exec(`UPDATE dead_letter_queue SET error = 'said <script>alert(3)</script>' WHERE id = $1`, dl)
	ctx := browser(t)
	var dl2 dialogs
	dl2.listen(ctx)
	base := e.srv.URL
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	// liveText reads an element's text in one evaluation: a live refresh
	// may replace the element between the steps of a query.
	liveText := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector(`+strconv.Quote(sel)+`).textContent.trim()`))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	eval := func(js string) int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return n
	}

	do("sign in",
		chromedp.Navigate(base+"/signin"),
		chromedp.SendKeys(chromedp.CSS(`input[name="name"]`), "ada"),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), testToken),
		chromedp.Click(chromedp.CSS(`#signin`)),
		chromedp.WaitVisible(chromedp.CSS(`#signed-in`)))
	shot(t, ctx, "overview")

	do("the event with a script payload",
		chromedp.Navigate(fmt.Sprintf("%s/topics/1/partitions/%d/offsets/%d", base, scriptPartition, script)),
		chromedp.WaitVisible(chromedp.CSS(`#payload`)))
	if payload, host := text(`#payload`), text(`#event-host`); !strings.Contains(payload, `"<script>alert(1)</script>"`) ||
		host != "<img src=x onerror=alert(2)>" {
		t.Errorf("the payload and host are not shown as text: %q, %q", payload, host)
	}
	if n := eval(`document.querySelectorAll('script').length`); n != 1 {
		t.Errorf("%d script elements on the event page, want 1 (the console's own)", n)
	}
	if n := eval(`document.querySelectorAll('img').length`); n != 0 {
		t.Errorf("%d img elements on the event page: the host id became markup", n)
	}
	shot(t, ctx, "event")

	do("pause",
		chromedp.Navigate(base+"/topics/1/groups/g"),
		chromedp.Click(chromedp.CSS(`#pause`)),
		chromedp.WaitVisible(chromedp.CSS(`#done`)))
	if state := liveText(`#group-state`); state != "PAUSED" || e.queryInt(`SELECT count(*) FROM subscriptions WHERE group_id = 'g' AND state = 'PAUSED'`) != 1 {
		t.Fatalf("after pause the page says %q and the database %s", state, e.dbState())
	}
	shot(t, ctx, "group")

	do("reset preview",
		chromedp.SetValue(chromedp.CSS(`select[name="to"]`), "earliest"),
		chromedp.Click(chromedp.CSS(`input[name="force"]`)), // the fixture's replica of g is live
		chromedp.Click(chromedp.CSS(`#reset-preview`)),
		chromedp.WaitVisible(chromedp.CSS(`#reset-confirm`)))
	want := e.queryInt(`SELECT count(*) FROM outbox_message_t m JOIN consumer_offsets o ON o.partition_id = m.partition_id
		WHERE o.group_id = 'g' AND m.c_offset < o.next_offset`)
	if replay := text(`#reset-replay`); replay != strconv.FormatInt(want, 10) {
		t.Fatalf("the confirmation says it replays %s events, the database holds %d before the positions", replay, want)
	}
	shot(t, ctx, "reset")
	do("reset confirmed", chromedp.Click(chromedp.CSS(`#reset-confirm`)), chromedp.WaitVisible(chromedp.CSS(`#done`)))
	if n := e.queryInt(`SELECT count(*) FROM consumer_offsets o WHERE o.group_id = 'g'
		AND o.next_offset <> coalesce((SELECT min(c_offset) FROM outbox_message_t m WHERE m.partition_id = o.partition_id), o.next_offset)`); n != 0 {
		t.Fatalf("%d partitions not at their first event after the reset to earliest", n)
	}

	// A live figure: the lag grows as events are appended, on the page
	// as it is, without a reload (the marker survives).
	lag0, _ := strconv.Atoi(liveText(`#group-lag`))
	eval(`window.__marker = 7`)
	for i := range 5 {
		e.appendTx(ev(fmt.Sprintf("late-%d", i), "t", `{}`))
	}
	waitFor(t, "the lag refreshed by itself", func() bool { return liveText(`#group-lag`) == strconv.Itoa(lag0+5) })
	if eval(`window.__marker || 0`) != 7 {
		t.Fatal("the page reloaded to refresh the lag")
	}

	do("the dead letters", chromedp.Navigate(base+"/dead-letters"), chromedp.WaitVisible(chromedp.CSS(`tr.dl`)))
	if got := text(`tr.dl .error-text`); got != "said <script>alert(3)</script>" {
		t.Errorf("the dead letter's error is shown as %q", got)
	}
	shot(t, ctx, "deadletters")
	do("one dead letter", chromedp.Navigate(fmt.Sprintf("%s/dead-letters/%d", base, dl)), chromedp.WaitVisible(chromedp.CSS(`#dl-error`)))
	shot(t, ctx, "deadletter")
	do("discard it from the list",
		chromedp.Navigate(base+"/dead-letters"),
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`input[name="id"][value="%d"]`, dl))),
		chromedp.Click(chromedp.CSS(`#dl-discard`)),
		chromedp.WaitVisible(chromedp.CSS(`#done`)))
	if n := e.queryInt(`SELECT count(*) FROM dead_letter_queue WHERE id = $1`, dl); n != 0 {
		t.Fatal("the dead letter was not discarded")
	}
	if c := dl2.of("confirm"); len(c) != 1 {
		t.Errorf("confirm dialogs %q, want the discard's", c)
	}

	for _, p := range []struct{ name, path, sel string }{
		{"events", "/topics/1/events", "table.events"},
		{"host", "/topics/1/hosts?host=host-2", "#host-path"},
		{"replicas", "/replicas", "#replicas"},
		{"audit", "/audit", "#audit"},
		{"overview-after", "/", "#overview"},
	} {
		do(p.name, chromedp.Navigate(base+p.path), chromedp.WaitVisible(chromedp.CSS(p.sel)))
		shot(t, ctx, p.name)
	}
	if a := dl2.of("alert"); len(a) != 0 {
		t.Fatalf("alerts fired: %q", a)
	}
}
