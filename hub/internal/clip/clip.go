// Package clip cuts what callers and members sent to a bounded length
// before the hub logs it, puts it in a metric's read model or tells it to
// someone else.
package clip

// String cuts s to at most n bytes, on a UTF-8 boundary, marking the cut.
func String(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "… (truncated)"
	cut := n - len(mark)
	for cut > 0 && s[cut]&0xC0 == 0x80 { // do not split a UTF-8 sequence
		cut--
	}
	return s[:cut] + mark
}
