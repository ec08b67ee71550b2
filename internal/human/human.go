// Package human writes durations and counts for people to read, the same
// way wherever pgevents shows them (the console's pages, the status
// command): a duration as "850 ms", "3.2 s", "42 s", "4 m 5 s", "3 h 20 m",
// "24 h", "7 d"; a count with thousands separators, "12,345".
//
// A duration keeps two units at most, and drops the smaller one when it
// is zero or when the larger one reaches 10 ("42 m", not "42 m 10 s"): a
// reader compares magnitudes at a glance. Hours go up to 48 ("24 h", "36
// h"), days begin there ("2 d 12 h", "7 d").
package human

import (
	"math"
	"strconv"
	"time"
)

// Duration writes d for a reader: "0 s", "850 ms", "3.2 s", "42 s",
// "4 m 5 s", "42 m", "3 h 20 m", "24 h", "2 d 12 h", "7 d". A negative
// duration is written as 0 s.
func Duration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0 s"
	case d < time.Second:
		return strconv.FormatInt(max(d.Round(time.Millisecond).Milliseconds(), 1), 10) + " ms"
	case d < 10*time.Second:
		s := strconv.FormatFloat(math.Round(d.Seconds()*10)/10, 'f', 1, 64)
		if s == "10.0" {
			return "10 s"
		}
		if len(s) > 2 && s[len(s)-2:] == ".0" {
			s = s[:len(s)-2]
		}
		return s + " s"
	case d < time.Minute-time.Second/2:
		return two(int64(d.Round(time.Second)/time.Second), 0, "s", "")
	case d < time.Hour-time.Second/2:
		s := int64(d.Round(time.Second) / time.Second)
		return two(s/60, s%60, "m", "s")
	case d < 48*time.Hour-time.Minute/2:
		m := int64(d.Round(time.Minute) / time.Minute)
		return two(m/60, m%60, "h", "m")
	}
	h := int64(d.Round(time.Hour) / time.Hour)
	return two(h/24, h%24, "d", "h")
}

// Seconds is Duration of s seconds.
func Seconds(s float64) string {
	if math.IsNaN(s) || s <= 0 {
		return Duration(0)
	}
	if s > float64(math.MaxInt64)/float64(time.Second) {
		return Duration(math.MaxInt64)
	}
	return Duration(time.Duration(s * float64(time.Second)))
}

// two writes "big bu small su", without the small part when it is zero or
// big is 10 or more.
func two(big, small int64, bu, su string) string {
	s := strconv.FormatInt(big, 10) + " " + bu
	if small != 0 && big < 10 {
		s += " " + strconv.FormatInt(small, 10) + " " + su
	}
	return s
}

// Count writes n with a comma between each group of three digits:
// "12,345", "-1,000".
func Count(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	if len(s) <= 3 {
		if neg {
			return "-" + s
		}
		return s
	}
	b := make([]byte, 0, len(s)+len(s)/3+1)
	if neg {
		b = append(b, '-')
	}
	head := len(s) % 3
	if head == 0 {
		head = 3
	}
	b = append(b, s[:head]...)
	for i := head; i < len(s); i += 3 {
		b = append(b, ',')
		b = append(b, s[i:i+3]...)
	}
	return string(b)
}

// Rate writes r events per second: "0.3/s", "12/s", "1,234/s"; an
// absolute value under 10 keeps a decimal.
func Rate(r float64) string {
	if r < 10 {
		s := strconv.FormatFloat(math.Round(r*10)/10, 'f', 1, 64)
		if s == "10.0" {
			return "10/s"
		}
		return s + "/s"
	}
	return Count(int64(math.Round(r))) + "/s"
}
