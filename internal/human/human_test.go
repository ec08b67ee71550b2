package human

import (
	"testing"
	"time"
)

func TestDuration(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0 s"},
		{0, "0 s"},
		{300 * time.Microsecond, "1 ms"},
		{850 * time.Millisecond, "850 ms"},
		{999 * time.Millisecond, "999 ms"},
		{time.Second, "1 s"},
		{3210 * time.Millisecond, "3.2 s"},
		{9960 * time.Millisecond, "10 s"},
		{42 * time.Second, "42 s"},
		{59600 * time.Millisecond, "1 m"},
		{time.Hour - 200*time.Millisecond, "1 h"},
		{4*time.Minute + 5*time.Second, "4 m 5 s"},
		{4 * time.Minute, "4 m"},
		{42*time.Minute + 10*time.Second, "42 m"},
		{3*time.Hour + 20*time.Minute, "3 h 20 m"},
		{24 * time.Hour, "24 h"},
		{36 * time.Hour, "36 h"},
		{60 * time.Hour, "2 d 12 h"},
		{168 * time.Hour, "7 d"},
		{30 * 24 * time.Hour, "30 d"},
	} {
		if got := Duration(c.d); got != c.want {
			t.Errorf("Duration(%s) = %q, want %q", c.d, got, c.want)
		}
	}
	if got := Seconds(3.21); got != "3.2 s" {
		t.Errorf("Seconds(3.21) = %q", got)
	}
	if got := Seconds(1e300); got != "106751 d" {
		t.Errorf("Seconds(1e300) = %q", got)
	}
}

func TestCount(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0", 7: "7", 999: "999", 1000: "1,000", 12345: "12,345", 123456: "123,456",
		1234567: "1,234,567", -1000: "-1,000", -12: "-12"} {
		if got := Count(n); got != want {
			t.Errorf("Count(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestRate(t *testing.T) {
	t.Parallel()
	for r, want := range map[float64]string{0: "0.0/s", 0.34: "0.3/s", 9.96: "10/s", 12.4: "12/s", 1234.5: "1,235/s"} {
		if got := Rate(r); got != want {
			t.Errorf("Rate(%g) = %q, want %q", r, got, want)
		}
	}
}
