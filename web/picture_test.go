package web

import (
	"bytes"
	"html/template"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub"
	"github.com/hubmesh/hub/trust"
)

// renderPicture draws the picture of a federation with the dashboard's
// templates and parses it as a browser does.
func renderPicture(t *testing.T, m *pictureModels) (string, *html.Node) {
	t.Helper()
	tmpl := template.Must(template.New("").Funcs(funcs).Funcs(pictureFuncs).ParseFS(templateFS, "templates/*.html"))
	var buf bytes.Buffer
	if err := tmpl.ExecuteTemplate(&buf, "picture", layoutPicture(m.Clusters(), m.Proxies(), m.TrustDomains())); err != nil {
		t.Fatal(err)
	}
	doc, err := html.Parse(strings.NewReader("<!doctype html><body>" + buf.String()))
	if err != nil {
		t.Fatal(err)
	}
	return buf.String(), doc
}

// find returns every element under n for which match holds.
func find(n *html.Node, match func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	for c := range n.Descendants() {
		if c.Type == html.ElementNode && match(c) {
			out = append(out, c)
		}
	}
	return out
}

func attr(n *html.Node, key string) (string, bool) {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val, true
		}
	}
	return "", false
}

func hasClass(n *html.Node, class string) bool {
	v, _ := attr(n, "class")
	for c := range strings.FieldsSeq(v) {
		if c == class {
			return true
		}
	}
	return false
}

// svgByID returns the picture's SVG with that id.
func svgByID(t *testing.T, doc *html.Node, id string) *html.Node {
	t.Helper()
	svgs := find(doc, func(n *html.Node) bool { v, _ := attr(n, "id"); return n.Data == "svg" && v == id })
	if len(svgs) != 1 {
		t.Fatalf("%d svg#%s in the picture", len(svgs), id)
	}
	return svgs[0]
}

// members returns the g.member elements of an SVG by data-cluster.
func members(svg *html.Node) map[string]*html.Node {
	out := map[string]*html.Node{}
	for _, n := range find(svg, func(n *html.Node) bool { return n.Data == "g" && hasClass(n, "member") }) {
		id, _ := attr(n, "data-cluster")
		out[id] = n
	}
	return out
}

func childText(n *html.Node, tag string) string {
	for c := range n.ChildNodes() {
		if c.Type == html.ElementNode && c.Data == tag && c.FirstChild != nil {
			return c.FirstChild.Data
		}
	}
	return ""
}

func TestPictureLayout(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		members                   int // besides the home cluster
		wide, compact, hiddenWide int
		hiddenCompact, trustShown int
		cards                     bool
		wantTitle                 string
	}{
		{name: "home only", members: 0, wide: 1, compact: 1, trustShown: 2, cards: true, wantTitle: "Federation: 1 member (1 Ready)"},
		{name: "3 members", members: 3, wide: 4, compact: 4, trustShown: 2, cards: true, wantTitle: "Federation: 4 members (4 Ready)"},
		{name: "7 members", members: 7, wide: 8, compact: 8, trustShown: 3, cards: true},
		{name: "8 members", members: 8, wide: 9, compact: 9, trustShown: 3},
		{name: "50 members", members: 50, wide: 51, compact: maxCompactMembers, hiddenCompact: 51 - maxCompactMembers, trustShown: 3},
		{name: "80 members", members: 80, wide: maxWideMembers, compact: maxCompactMembers, hiddenWide: 81 - maxWideMembers, hiddenCompact: 81 - maxCompactMembers, trustShown: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := federation(tc.members)
			p := layoutPicture(m.Clusters(), m.Proxies(), m.TrustDomains())
			if p.Cards != tc.cards || p.WideHidden != tc.hiddenWide || p.CompactHidden != tc.hiddenCompact {
				t.Errorf("cards %v, hidden %d wide, %d compact; want %v, %d, %d", p.Cards, p.WideHidden, p.CompactHidden, tc.cards, tc.hiddenWide, tc.hiddenCompact)
			}
			if !strings.HasPrefix(p.Title, tc.wantTitle) {
				t.Errorf("title %q; want it to start with %q", p.Title, tc.wantTitle)
			}
			_, doc := renderPicture(t, m)
			for id, want := range map[string]int{"federation": tc.wide, "federation-compact": tc.compact} {
				svg := svgByID(t, doc, id)
				got := members(svg)
				if len(got) != want {
					t.Errorf("%s draws %d members; want %d", id, len(got), want)
				}
				if _, ok := got["primary"]; !ok {
					t.Errorf("%s lacks the home cluster", id)
				}
				if v, _ := attr(got["primary"], "data-home"); v != "true" {
					t.Errorf("%s: the home cluster is not marked data-home", id)
				}
				if v, _ := attr(svg, "data-members"); v != strconv.Itoa(tc.members+1) {
					t.Errorf("%s data-members=%q", id, v)
				}
				if v, _ := attr(svg, "role"); v != "img" || childText(svg, "title") == "" || childText(svg, "desc") == "" {
					t.Errorf("%s: role %q, no title or desc", id, v)
				}
				for cid, n := range got {
					if title := childText(n, "title"); !strings.HasPrefix(title, cid) {
						t.Errorf("%s: member %s has the <title> %q (its accessible name)", id, cid, title)
					}
				}
				tds := find(svg, func(n *html.Node) bool { return hasClass(n, "trustdomain") })
				if len(tds) != tc.trustShown {
					t.Errorf("%s shows %d trust domains; want %d", id, len(tds), tc.trustShown)
				}
				hidden := find(svg, func(n *html.Node) bool { _, ok := attr(n, "data-hidden"); return ok })
				wantHidden := tc.hiddenWide
				if id == "federation-compact" {
					wantHidden = tc.hiddenCompact
				}
				if wantHidden > 0 && (len(hidden) != 1 || func() string { v, _ := attr(hidden[0], "data-hidden"); return v }() != strconv.Itoa(wantHidden)) {
					t.Errorf("%s: the count of hidden members is missing or wrong", id)
				}
			}
			// Members in trouble are hidden only when they alone overflow
			// the picture.
			for id, limit := range map[string]int{"federation": maxWideMembers, "federation-compact": maxCompactMembers} {
				drawn := members(svgByID(t, doc, id))
				var troubled []string
				for _, st := range m.Clusters() {
					if st.State != clusters.StateReady {
						troubled = append(troubled, st.ID)
					}
				}
				for _, tid := range troubled {
					if _, ok := drawn[tid]; !ok && len(troubled) < limit {
						t.Errorf("%s hides %s, which is in trouble", id, tid)
					}
				}
				if len(troubled) >= limit {
					for did, n := range drawn {
						if v, _ := attr(n, "data-state"); v == "Ready" && did != "primary" {
							t.Errorf("%s draws Ready %s while members in trouble are hidden", id, did)
						}
					}
				}
			}
			checkGeometry(t, p)
		})
	}
}

// checkGeometry: every node lies inside its viewBox, and cards and dots do
// not overlap.
func checkGeometry(t *testing.T, p picture) {
	t.Helper()
	type box struct{ x0, y0, x1, y1 int }
	var boxes []box
	for _, n := range p.Wide {
		b := box{n.X - 95, n.Y - 33, n.X + 95, n.Y + 33}
		if !p.Cards {
			b = box{n.X - 38, n.Y - 20, n.X + 38, n.Y + 36} // the dot and its label
		}
		if b.x0 < 0 || b.y0 < 0 || b.x1 > p.TrustX || b.y1 > p.WideH {
			t.Errorf("member %s at %+v is outside the wide picture (%dx%d, trust column at %d)", n.ID, b, 1000, p.WideH, p.TrustX)
		}
		for _, mk := range n.Marks {
			if mk.X < 0 || mk.Y < 7 || mk.Y > p.WideH-7 {
				t.Errorf("a client mark of %s at %d,%d is outside the wide picture", n.ID, mk.X, mk.Y)
			}
		}
		for _, o := range boxes {
			if b.x0 < o.x1 && o.x0 < b.x1 && b.y0 < o.y1 && o.y0 < b.y1 {
				t.Errorf("member %s at %+v overlaps another at %+v", n.ID, b, o)
			}
		}
		boxes = append(boxes, b)
	}
	for _, td := range p.Trust {
		if td.X+td.W > 1000 || td.Y+38 > p.WideH {
			t.Errorf("trust domain %s is outside the wide picture", td.Name)
		}
	}
	for _, r := range p.Rows {
		if r.Y+52 > p.CompactH {
			t.Errorf("compact row %s is outside the picture", r.ID)
		}
	}
	for _, td := range p.CTrust {
		if td.Y+38 > p.CompactH {
			t.Errorf("compact trust domain %s is outside the picture", td.Name)
		}
	}
}

// TestPictureStates: every member and trust domain state is drawn with its
// name, a colour class and a glyph (never colour alone).
func TestPictureStates(t *testing.T) {
	states := []clusters.State{clusters.StatePending, clusters.StateSyncing, clusters.StateReady, clusters.StateStale,
		clusters.StateUnreachable, clusters.StateTimedOut, clusters.StateInvalid, clusters.StateConflict}
	m := &pictureModels{}
	m.members = append(m.members, clusters.Status{ID: "primary", State: clusters.StateReady})
	for _, s := range states {
		m.members = append(m.members, clusters.Status{ID: "m-" + string(s), Secret: "ns/s", State: s})
	}
	tdStates := []trust.State{trust.StatePending, trust.StateReady, trust.StateStale, trust.StateError}
	for _, s := range tdStates {
		m.tds = append(m.tds, trust.Status{Spec: trust.PeerSpec{TrustDomain: "td-" + strings.ToLower(string(s)) + ".example"}, State: s})
	}
	_, doc := renderPicture(t, m)
	wantTone := map[clusters.State]string{
		clusters.StatePending: "wait", clusters.StateSyncing: "wait", clusters.StateReady: "ok", clusters.StateStale: "warn",
		clusters.StateTimedOut: "warn", clusters.StateUnreachable: "bad", clusters.StateInvalid: "bad", clusters.StateConflict: "bad",
	}
	for _, id := range []string{"federation", "federation-compact"} {
		got := members(svgByID(t, doc, id))
		for _, s := range states {
			n := got["m-"+string(s)]
			if n == nil {
				t.Fatalf("%s: no member in state %s", id, s)
			}
			if v, _ := attr(n, "data-state"); v != string(s) {
				t.Errorf("%s: data-state %q; want %s", id, v, s)
			}
			if !hasClass(n, "tone-"+wantTone[s]) {
				t.Errorf("%s: %s is not drawn as %s", id, s, wantTone[s])
			}
			texts := find(n, func(c *html.Node) bool { return c.Data == "text" || c.Data == "tspan" })
			var all []string
			for _, tx := range texts {
				if tx.FirstChild != nil && tx.FirstChild.Type == html.TextNode {
					all = append(all, tx.FirstChild.Data)
				}
			}
			joined := strings.Join(all, " ")
			if !strings.Contains(joined, clusterTone(s).Glyph) {
				t.Errorf("%s: %s has no glyph %q in %q", id, s, clusterTone(s).Glyph, joined)
			}
			if id == "federation-compact" && !strings.Contains(joined, string(s)) {
				t.Errorf("%s: %s does not say its state in %q", id, s, joined)
			}
		}
		for _, s := range tdStates {
			tds := find(svgByID(t, doc, id), func(n *html.Node) bool {
				v, _ := attr(n, "data-state")
				return hasClass(n, "trustdomain") && v == string(s)
			})
			if len(tds) != 1 || !hasClass(tds[0], "tone-"+trustTone(s).Class) {
				t.Errorf("%s: trust domain state %s drawn %d times or in the wrong tone", id, s, len(tds))
			}
		}
	}
}

// TestPictureEscapesNames: member IDs, proxy IDs, trust domains and status
// messages are untrusted; they reach the picture as text and attribute
// values only, never as markup.
func TestPictureEscapesNames(t *testing.T) {
	evil := []string{`<script>alert(1)</script>`, `"><svg onload=alert(2)>`, `' onmouseover='alert(3)`, `</title><script>alert(4)</script>`}
	m := &pictureModels{}
	m.members = append(m.members, clusters.Status{ID: "primary", State: clusters.StateReady, Message: `</desc><img src=x onerror=alert(5)>`})
	for i, id := range evil {
		m.members = append(m.members, clusters.Status{ID: id, Secret: "ns/s", State: clusters.StateReady})
		m.proxies = append(m.proxies, hub.ProxyStatus{ID: "proxy" + evil[(i+1)%len(evil)], Cluster: id, Proxyless: true})
	}
	m.tds = []trust.Status{{Spec: trust.PeerSpec{TrustDomain: `td"><script>alert(6)</script>`}, State: trust.StateReady}}
	raw, doc := renderPicture(t, m)
	if n := find(doc, func(n *html.Node) bool { return n.Data == "script" || n.Data == "img" }); len(n) > 0 {
		t.Errorf("the picture carries injected elements: %d, e.g. <%s>", len(n), n[0].Data)
	}
	for n := range doc.Descendants() {
		for _, a := range n.Attr {
			if strings.HasPrefix(a.Key, "on") {
				t.Errorf("injected attribute %s=%q on <%s>", a.Key, a.Val, n.Data)
			}
		}
	}
	if strings.Contains(raw, "<script>") {
		t.Errorf("the markup contains <script>")
	}
	// The names come back intact as attribute values.
	for _, id := range []string{"federation", "federation-compact"} {
		got := members(svgByID(t, doc, id))
		for _, name := range evil {
			if got[name] == nil {
				t.Errorf("%s: member %q is not found by its data-cluster", id, name)
			}
		}
		proxies := find(svgByID(t, doc, id), func(n *html.Node) bool { return hasClass(n, "proxies") })
		if len(proxies) != len(evil) {
			t.Errorf("%s: %d proxy groups; want %d", id, len(proxies), len(evil))
		}
	}
}

// TestPictureGroupsClients: clients are counted per member and kind, drawn
// one by one when few and as counts when many; clients of no known member
// are counted apart.
func TestPictureGroupsClients(t *testing.T) {
	m := &pictureModels{}
	m.members = []clusters.Status{{ID: "primary", State: clusters.StateReady}, {ID: "west", Secret: "ns/w", State: clusters.StateReady}}
	for i := range 9 {
		m.proxies = append(m.proxies, hub.ProxyStatus{ID: "g" + strconv.Itoa(i), Cluster: "west", Proxyless: true})
	}
	m.proxies = append(m.proxies,
		hub.ProxyStatus{ID: "e1", Cluster: "west"},
		hub.ProxyStatus{ID: "i1", Cluster: "west", ConfigSubscriber: true},
		hub.ProxyStatus{ID: "p1", Cluster: "primary", Proxyless: true},
		hub.ProxyStatus{ID: "x1", Cluster: "gone", Proxyless: true},
		hub.ProxyStatus{ID: "i2", ConfigSubscriber: true})
	p := layoutPicture(m.Clusters(), m.Proxies(), nil)
	if p.Proxies != 12 || p.Istiods != 2 {
		t.Errorf("%d proxies, %d istiods; want 12, 2", p.Proxies, p.Istiods)
	}
	if u := p.Unassigned; u.GRPC != 1 || u.Istiod != 1 || u.Envoy != 0 {
		t.Errorf("unassigned %+v", u)
	}
	for _, n := range p.Wide {
		switch n.ID {
		case "west":
			if c := n.Clients; c.GRPC != 9 || c.Envoy != 1 || c.Istiod != 1 || len(n.Marks) != 3 || n.Marks[0].Count != 9 {
				t.Errorf("west's clients %+v, marks %+v; want 3 counted marks", c, n.Marks)
			}
		case "primary":
			if len(n.Marks) != 1 || n.Marks[0].Count != 0 || !strings.Contains(n.Marks[0].Title, "p1") {
				t.Errorf("primary's marks %+v; want one mark for p1", n.Marks)
			}
		}
	}
	_, doc := renderPicture(t, m)
	for _, id := range []string{"federation", "federation-compact"} {
		svg := svgByID(t, doc, id)
		want := map[string]string{"proxies/west": "10", "subscribers/west": "1", "proxies/primary": "1", "proxies/": "1", "subscribers/": "1"}
		for _, n := range find(svg, func(n *html.Node) bool { return hasClass(n, "proxies") || hasClass(n, "subscribers") }) {
			c, _ := attr(n, "data-cluster")
			kind := "proxies"
			if hasClass(n, "subscribers") {
				kind = "subscribers"
			}
			count, _ := attr(n, "data-count")
			if want[kind+"/"+c] != count {
				t.Errorf("%s: %s of %q count %s; want %q", id, kind, c, count, want[kind+"/"+c])
			}
			delete(want, kind+"/"+c)
		}
		if len(want) > 0 {
			t.Errorf("%s lacks client groups %v", id, want)
		}
	}
}

// TestPictureLiveUpdate: the overview's live stream carries the picture, and
// a member's new state reaches it without a reload.
func TestPictureLiveUpdate(t *testing.T) {
	models := federation(3)
	s := startServer(t, models.config(), ServerOptions{}, nil)
	cookie, _ := s.signIn(t, "good")
	_, page := s.get(t, "/", cookie)
	if !strings.Contains(page, `<svg id="federation"`) || !strings.Contains(page, `data-cluster="west" data-state="Ready"`) {
		t.Fatalf("the overview lacks the picture")
	}
	st := s.openStream(t, "/", cookie)
	if ev := st.next(t, 30*time.Second); ev.name != "update" || !strings.Contains(ev.data, `data-cluster="west" data-state="Ready"`) {
		t.Fatalf("first live update lacks the picture: %+v", ev.name)
	}
	models.setState("west", clusters.StateUnreachable)
	for {
		ev := st.next(t, 30*time.Second)
		if ev.name == "update" && strings.Contains(ev.data, `data-cluster="west" data-state="Unreachable"`) {
			if !strings.Contains(ev.data, `<svg id="federation-compact"`) {
				t.Errorf("the update carries the wide picture only")
			}
			break
		}
	}
}
