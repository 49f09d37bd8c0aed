package web

import (
	"bytes"
	"fmt"
	"html/template"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/net/html"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/xdsstatus"
	"github.com/hubmesh/hub/trust"
)

// renderPicture draws the picture of a federation with the dashboard's
// templates and parses it as a browser does.
func renderPicture(t *testing.T, m *pictureModels) (string, *html.Node) {
	t.Helper()
	tmpl := template.Must(template.New("").Funcs(funcs).Funcs(pictureFuncs).ParseFS(templateFS, "templates/*.html"))
	var buf bytes.Buffer
	if err := tmpl.ExecuteTemplate(&buf, "picture", layoutPicture(m.Clusters(), m.Proxies(), m.TrustDomains(), m.certified())); err != nil {
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
		networked                 bool
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
		{name: "home only, networked", networked: true, wide: 1, compact: 1, trustShown: 2, cards: true, wantTitle: "Federation: 1 member on 1 network (1 Ready)"},
		{name: "3 members, networked", members: 3, networked: true, wide: 4, compact: 4, trustShown: 2, cards: true, wantTitle: "Federation: 4 members on 4 networks (4 Ready)"},
		{name: "7 members, networked", members: 7, networked: true, wide: 8, compact: 8, trustShown: 3, cards: true, wantTitle: "Federation: 8 members on 4 networks, 1 on none ("},
		{name: "50 members, networked", members: 50, networked: true, wide: 51, compact: maxCompactMembers, hiddenCompact: 51 - maxCompactMembers, trustShown: 3},
		{name: "500 members, networked", members: 500, networked: true, wide: maxWideMembers, compact: maxCompactMembers, hiddenWide: 501 - maxWideMembers, hiddenCompact: 501 - maxCompactMembers, trustShown: 3, wantTitle: "Federation: 501 members on 4 networks, 56 on none ("},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := federation(tc.members)
			if tc.networked {
				m.setNetworks()
			}
			p := layoutPicture(m.Clusters(), m.Proxies(), m.TrustDomains(), m.certified())
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

// checkGeometry: every node lies inside its viewBox, cards and dots do not
// overlap, and no client mark lies on a card.
func checkGeometry(t *testing.T, p picture) {
	t.Helper()
	type box struct{ x0, y0, x1, y1 int }
	var boxes []box
	for _, n := range p.Wide {
		// The card and the demoted tag astride its top edge.
		b := box{n.X - 95, n.Y + p.CardTop - 9, n.X + 95, n.Y + p.CardTop + p.CardH}
		if !p.Cards {
			b = box{n.X - 38, n.Y - 20, n.X + 38, n.Y + 36} // the dot and its label
			if p.Networked {
				b.y1 = n.Y + 51 // and its network
			}
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
	for _, n := range p.Wide {
		for _, mk := range n.Marks {
			for _, o := range boxes {
				if mk.X+7 > o.x0 && mk.X-7 < o.x1 && mk.Y+7 > o.y0 && mk.Y-7 < o.y1 {
					t.Errorf("a client mark of %s at %d,%d lies on a member at %+v", n.ID, mk.X, mk.Y, o)
				}
			}
		}
	}
	for _, td := range p.Trust {
		if td.X+td.W > 1000 || td.Y+38 > p.WideH {
			t.Errorf("trust domain %s is outside the wide picture", td.Name)
		}
	}
	for i, r := range p.Rows {
		if r.Y+p.RowH > p.CompactH {
			t.Errorf("compact row %s is outside the picture", r.ID)
		}
		// A demoted tag sits astride the row's top edge, clear of the row above.
		if r.Demoted != "" && i > 0 && r.Y-9 <= p.Rows[i-1].Y+p.RowH {
			t.Errorf("compact row %s's demoted tag lies on the row above", r.ID)
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
		m.proxies = append(m.proxies, xdsstatus.Proxy{ID: "proxy" + evil[(i+1)%len(evil)], Cluster: id, Proxyless: true})
	}
	m.tds = []trust.Status{{Spec: trust.PeerSpec{TrustDomain: `td"><script>alert(6)</script>`}, State: trust.StateReady}}
	for i := range m.members {
		m.members[i].Network = evil[i%len(evil)]
		m.members[i].Demoted = evil[(i+2)%len(evil)]
	}
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
		for i, name := range evil {
			if v, _ := attr(got[name], "data-network"); v != evil[(i+1)%len(evil)] {
				t.Errorf("%s: member %q has data-network %q; want %q", id, name, v, evil[(i+1)%len(evil)])
			}
		}
	}
	nets := find(doc, func(n *html.Node) bool { return n.Data == "li" && hasClass(n, "network") })
	if len(nets) != len(evil) {
		t.Errorf("the legend lists %d networks; want %d", len(nets), len(evil))
	}
}

// TestPictureGroupsClients: clients are counted per member and kind, drawn
// one by one when few and as counts when many; clients of no known member
// are counted apart.
func TestPictureGroupsClients(t *testing.T) {
	m := &pictureModels{}
	m.members = []clusters.Status{{ID: "primary", State: clusters.StateReady}, {ID: "west", Secret: "ns/w", State: clusters.StateReady}}
	for i := range 9 {
		m.proxies = append(m.proxies, xdsstatus.Proxy{ID: "g" + strconv.Itoa(i), Cluster: "west", Proxyless: true})
	}
	m.proxies = append(m.proxies,
		xdsstatus.Proxy{ID: "e1", Cluster: "west"},
		xdsstatus.Proxy{ID: "i1", Cluster: "west", ConfigSubscriber: true},
		xdsstatus.Proxy{ID: "p1", Cluster: "primary", Proxyless: true},
		xdsstatus.Proxy{ID: "x1", Cluster: "gone", Proxyless: true},
		xdsstatus.Proxy{ID: "i2", ConfigSubscriber: true})
	p := layoutPicture(m.Clusters(), m.Proxies(), nil, nil)
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

// texts returns the text of every text and tspan element under n (not of
// titles: what is drawn), by class.
func texts(n *html.Node, class string) []string {
	var out []string
	for _, c := range find(n, func(c *html.Node) bool { return (c.Data == "text" || c.Data == "tspan") && hasClass(c, class) }) {
		if c.FirstChild != nil && c.FirstChild.Type == html.TextNode {
			out = append(out, c.FirstChild.Data)
		}
	}
	return out
}

// TestPictureNetworks: every member says its network, coloured per network,
// and its gateway count; a member on a network without a gateway is marked;
// a demoted member says so and why; the legend counts each network's members.
func TestPictureNetworks(t *testing.T) {
	m := federation(3)
	m.setNetworks()
	m.setState("west", clusters.StateStale)
	m.demote("west", "the member is Stale: its endpoints are served one priority behind")
	p := layoutPicture(m.Clusters(), m.Proxies(), m.TrustDomains(), m.certified())
	if !p.Networked || p.NoNetwork != 0 || p.Demoted != 1 || p.NetworksHidden != 0 {
		t.Errorf("networked %v, %d on no network, %d demoted, %d networks hidden; want true, 0, 1, 0", p.Networked, p.NoNetwork, p.Demoted, p.NetworksHidden)
	}
	wantNets := []picNetwork{
		{Name: "net-central", Label: "net-central", Class: "net-0", Members: 1, Gateways: 1},
		{Name: "net-dark", Label: "net-dark", Class: "net-1", Members: 1, NoGateway: 1},
		{Name: "net-east", Label: "net-east", Class: "net-2", Members: 1, Gateways: 1},
		{Name: "net-west", Label: "net-west", Class: "net-3", Members: 1, Gateways: 1},
	}
	if len(p.Networks) != len(wantNets) {
		t.Fatalf("networks %+v; want %+v", p.Networks, wantNets)
	}
	for i, n := range p.Networks {
		if n != wantNets[i] {
			t.Errorf("network %d is %+v; want %+v", i, n, wantNets[i])
		}
	}
	if want := "Federation: 4 members on 4 networks (3 Ready, 1 Stale)"; !strings.HasPrefix(p.Title, want) {
		t.Errorf("title %q; want it to start with %q", p.Title, want)
	}
	for _, want := range []string{"north: Ready", "network net-dark, no east-west gateway, 10 endpoints withheld from other networks",
		"west: Stale, 3 services, 6 endpoints; 1 proxyless gRPC, 1 Envoy/other xDS; 7 workload identities certified by the hub's CA",
		"east: Ready", "network net-east, 1 east-west gateway, 8 endpoints withheld from proxyless gRPC clients of other networks: no gateway of its network admits them", "demoted: the member is Stale",
		"Network net-dark: 1 member, 0 east-west gateways (1 without one"} {
		if !strings.Contains(p.Desc, want) {
			t.Errorf("the description lacks %q: %s", want, p.Desc)
		}
	}
	want := map[string]struct {
		net, class, gw string
		noGateway      bool
		demoted        bool
	}{
		"primary": {"net-central", "net-0", "⇄ 1 gateway", false, false},
		"west":    {"net-west", "net-3", "⇄ 1 gateway", false, true},
		"east":    {"net-east", "net-2", "⇄ 1 gw · ! no gRPC", false, false},
		"north":   {"net-dark", "net-1", "! no gateway", true, false},
	}
	for _, n := range p.Wide {
		w := want[n.ID]
		if n.Network != w.net || n.NetClass != w.class || n.GatewayText() != w.gw || n.NoGateway() != w.noGateway || (n.Demoted != "") != w.demoted {
			t.Errorf("%s: network %q (%s), %q, no gateway %v, demoted %q; want %+v", n.ID, n.Network, n.NetClass, n.GatewayText(), n.NoGateway(), n.Demoted, w)
		}
	}
	checkGeometry(t, p)

	_, doc := renderPicture(t, m)
	for _, id := range []string{"federation", "federation-compact"} {
		got := members(svgByID(t, doc, id))
		for cid, w := range want {
			n := got[cid]
			if n == nil {
				t.Fatalf("%s: no member %s", id, cid)
			}
			if v, _ := attr(n, "data-network"); v != w.net {
				t.Errorf("%s: %s has data-network %q; want %q", id, cid, v, w.net)
			}
			if v, _ := attr(n, "data-gateways"); v != map[bool]string{true: "0", false: "1"}[w.noGateway] {
				t.Errorf("%s: %s has data-gateways %q", id, cid, v)
			}
			if v, _ := attr(n, "data-no-proxyless"); (v == "true") != (cid == "east") {
				t.Errorf("%s: %s has data-no-proxyless %q; want it on east alone (its network's gateways do not admit proxyless gRPC)", id, cid, v)
			}
			if nets := texts(n, "net-name"); len(nets) != 1 || nets[0] != w.net {
				t.Errorf("%s: %s shows the network %q; want %q", id, cid, nets, w.net)
			}
			if nets := find(n, func(c *html.Node) bool { return hasClass(c, "net-name") }); len(nets) != 1 || !hasClass(nets[0], w.class) {
				t.Errorf("%s: %s's network is not coloured %s", id, cid, w.class)
			}
			if gws := texts(n, "gw"); len(gws) != 1 || gws[0] != w.gw {
				t.Errorf("%s: %s shows the gateways %q; want %q", id, cid, gws, w.gw)
			}
			if hasClass(n, "no-gateway") != w.noGateway || (len(texts(n, "gw-none")) == 1) != w.noGateway {
				t.Errorf("%s: %s is marked without gateway: %v; want %v", id, cid, hasClass(n, "no-gateway"), w.noGateway)
			}
			tags := find(n, func(c *html.Node) bool { return hasClass(c, "demoted-tag") })
			if v, _ := attr(n, "data-demoted"); (v == "true") != w.demoted || (len(tags) == 1) != w.demoted {
				t.Errorf("%s: %s data-demoted %q with %d tags; want demoted %v", id, cid, v, len(tags), w.demoted)
			}
			if w.demoted && (len(tags) != 1 || !strings.HasPrefix(childText(tags[0], "title"), "Demoted: the member is Stale") || texts(tags[0], "demoted-text")[0] != "▼ demoted") {
				t.Errorf("%s: %s's demoted tag does not say why", id, cid)
			}
		}
	}
	legend := find(doc, func(n *html.Node) bool { return n.Data == "li" && hasClass(n, "network") })
	if len(legend) != len(wantNets) {
		t.Fatalf("the legend lists %d networks; want %d", len(legend), len(wantNets))
	}
	for i, li := range legend {
		name, _ := attr(li, "data-network")
		count, _ := attr(li, "data-members")
		gws, _ := attr(li, "data-gateways")
		w := wantNets[i]
		if name != w.Name || count != strconv.Itoa(w.Members) || gws != strconv.Itoa(w.Gateways) {
			t.Errorf("legend %d: %q with %s members, %s gateways; want %+v", i, name, count, gws, w)
		}
		swatch := find(li, func(n *html.Node) bool { return hasClass(n, "net-swatch") })
		if len(swatch) != 1 || !hasClass(swatch[0], w.Class) {
			t.Errorf("legend %d: %s's swatch is not coloured %s", i, name, w.Class)
		}
		if got := find(li, func(n *html.Node) bool { return hasClass(n, "gw-none") }); (len(got) == 1) != (w.NoGateway > 0) {
			t.Errorf("legend %d: %s marks its members without gateway %d times; want %d", i, name, len(got), w.NoGateway)
		}
	}
}

// TestPictureNoNetworks: without networks or gateways the picture says
// nothing about them (a flat federation keeps its small cards).
func TestPictureNoNetworks(t *testing.T) {
	m := federation(3)
	p := layoutPicture(m.Clusters(), m.Proxies(), m.TrustDomains(), m.certified())
	if p.Networked || len(p.Networks) != 0 || p.NoNetwork != 0 || p.CardH != 66 || p.RowH != 52 {
		t.Errorf("networked %v, networks %v, %d on no network, card height %d, row height %d; want none, 66, 52", p.Networked, p.Networks, p.NoNetwork, p.CardH, p.RowH)
	}
	raw, doc := renderPicture(t, m)
	for _, s := range []string{"fed-networks", "data-network", "net-name", "gateway", "demoted"} {
		if strings.Contains(raw, s) {
			t.Errorf("the picture of a flat federation says %q", s)
		}
	}
	if n := find(doc, func(n *html.Node) bool { return hasClass(n, "gw") }); len(n) != 0 {
		t.Errorf("%d gateway counts in a flat federation", len(n))
	}
	// A member on no network among networked ones says so; the legend
	// counts it.
	m.mu.Lock()
	m.members[1].Network = "net-a"
	m.members[1].Gateways = []clusters.Gateway{{Address: "192.0.2.1", Port: 15443}, {Address: "192.0.2.2", Port: 15443}}
	m.mu.Unlock()
	p = layoutPicture(m.Clusters(), m.Proxies(), m.TrustDomains(), m.certified())
	if p.NoNetwork != 3 || !strings.HasPrefix(p.Title, "Federation: 4 members on 1 network, 3 on none (") {
		t.Errorf("%d on no network, title %q", p.NoNetwork, p.Title)
	}
	_, doc = renderPicture(t, m)
	got := members(svgByID(t, doc, "federation"))
	if gws := texts(got["west"], "gw"); len(gws) != 1 || gws[0] != "⇄ 2 gateways" {
		t.Errorf("west shows %q", gws)
	}
	if gws := texts(got["east"], "gw"); len(gws) != 1 || gws[0] != "no gateway" || hasClass(got["east"], "no-gateway") {
		t.Errorf("east, on no network, shows %q and is marked %v", gws, hasClass(got["east"], "no-gateway"))
	}
	none := find(doc, func(n *html.Node) bool { v, ok := attr(n, "data-network"); return n.Data == "li" && ok && v == "" })
	if len(none) != 1 || func() string { v, _ := attr(none[0], "data-members"); return v }() != "3" {
		t.Errorf("the legend does not count the 3 members on no network")
	}
}

// TestPictureNetworkColours: a network's colour class is its place among
// the networks sorted by name, reused in turn, whatever the members' order;
// the legend lists at most maxNetworksShown networks and counts the rest.
func TestPictureNetworkColours(t *testing.T) {
	var sts []clusters.Status
	for i := range maxNetworksShown + 3 {
		sts = append(sts, clusters.Status{ID: fmt.Sprintf("m%02d", i), Secret: "ns/s", State: clusters.StateReady,
			Network: fmt.Sprintf("net-%02d", (i*7)%(maxNetworksShown+3))})
	}
	p := layoutPicture(sts, nil, nil, nil)
	reversed := append([]clusters.Status(nil), sts...)
	slices.Reverse(reversed)
	q := layoutPicture(reversed, nil, nil, nil)
	if len(p.Networks) != maxNetworksShown || p.NetworksHidden != 3 {
		t.Errorf("legend of %d networks, %d hidden; want %d, 3", len(p.Networks), p.NetworksHidden, maxNetworksShown)
	}
	if !strings.Contains(p.Title, "on 15 networks") || !strings.Contains(p.Desc, "And 3 more networks.") {
		t.Errorf("title %q, description %q: want all networks counted", p.Title, p.Desc)
	}
	for i, n := range p.Networks {
		if want := fmt.Sprintf("net-%d", i%netPalette); n.Class != want || n.Name != fmt.Sprintf("net-%02d", i) || q.Networks[i] != n {
			t.Errorf("network %d: %+v; want %s in class %s whatever the members' order (%+v)", i, n, fmt.Sprintf("net-%02d", i), want, q.Networks[i])
		}
	}
	for _, n := range p.Wide {
		var idx int
		fmt.Sscanf(n.Network, "net-%d", &idx)
		if want := fmt.Sprintf("net-%d", idx%netPalette); n.NetClass != want {
			t.Errorf("%s on %s has class %s; want %s", n.ID, n.Network, n.NetClass, want)
		}
	}
	_, doc := renderPicture(t, &pictureModels{members: sts})
	more := find(doc, func(n *html.Node) bool { v, _ := attr(n, "data-hidden"); return n.Data == "li" && v == "3" })
	if len(more) != 1 {
		t.Errorf("the legend does not count the 3 networks it leaves out")
	}
	// A long network name is cut.
	long := strings.Repeat("n", 70)
	p = layoutPicture([]clusters.Status{{ID: "primary", State: clusters.StateReady, Network: long}}, nil, nil, nil)
	if n := p.Wide[0]; utf8.RuneCountInString(n.NetLabel) != 14 || utf8.RuneCountInString(n.NetShort) != 10 || utf8.RuneCountInString(p.Networks[0].Label) != 40 {
		t.Errorf("network labels %q, %q, %q are not cut", n.NetLabel, n.NetShort, p.Networks[0].Label)
	}
}

// TestPictureKeepsProblems: when not all members fit, demoted members and
// members on a network without a gateway are drawn before healthy ones, in
// both layouts and whether drawn as dots or as rows.
func TestPictureKeepsProblems(t *testing.T) {
	m := federation(80)
	m.setNetworks()
	m.mu.Lock()
	var noGateway []string
	for i := range m.members {
		st := &m.members[i]
		st.State = clusters.StateReady
		if st.ID != "primary" && st.Network != "" && len(st.Gateways) == 0 {
			noGateway = append(noGateway, st.ID)
		}
	}
	m.mu.Unlock()
	m.demote("member-70", "served behind the healthy members'")
	m.demote("member-77", "served behind the healthy members'")
	p := layoutPicture(m.Clusters(), m.Proxies(), m.TrustDomains(), m.certified())
	if p.Demoted != 2 || p.CompactHidden != 81-maxCompactMembers || p.WideHidden != 81-maxWideMembers {
		t.Fatalf("%d demoted, %d and %d hidden", p.Demoted, p.CompactHidden, p.WideHidden)
	}
	if len(noGateway) < 3 || 3+len(noGateway) > maxWideMembers {
		t.Fatalf("%d members without gateway: the test needs a few", len(noGateway))
	}
	wide := map[string]bool{}
	for _, n := range p.Wide {
		wide[n.ID] = true
	}
	compact := map[string]bool{}
	for _, r := range p.Rows {
		compact[r.ID] = true
	}
	for _, id := range append([]string{"primary", "member-70", "member-77"}, noGateway...) {
		if !wide[id] {
			t.Errorf("the wide layout hides %s", id)
		}
	}
	for _, id := range []string{"primary", "member-70", "member-77"} {
		if !compact[id] {
			t.Errorf("the compact layout hides %s", id)
		}
	}
	// The compact rows left after the home cluster and the demoted go to
	// members without gateway (more of them than rows).
	for _, r := range p.Rows {
		if r.rank() == 3 {
			t.Errorf("the compact layout draws healthy %s while members without gateway are hidden", r.ID)
		}
	}
	// Members whose state is in trouble come before members without a
	// gateway.
	m.setState("member-10", clusters.StateUnreachable)
	p = layoutPicture(m.Clusters(), m.Proxies(), m.TrustDomains(), m.certified())
	if !slices.ContainsFunc(p.Rows, func(r compactRow) bool { return r.ID == "member-10" }) {
		t.Errorf("the compact layout hides Unreachable member-10")
	}
	_, doc := renderPicture(t, m)
	for _, id := range []string{"federation", "federation-compact"} {
		got := members(svgByID(t, doc, id))
		for _, cid := range []string{"member-70", "member-77"} {
			if v, _ := attr(got[cid], "data-demoted"); v != "true" {
				t.Errorf("%s: demoted %s is not drawn as demoted", id, cid)
			}
		}
	}
	checkGeometry(t, p)
}

// TestPictureNetworkGatewayServesItsMembers: a member without a gateway of
// its own on a network where another member has one is reached through
// it (the hub's xDS), so it is not marked.
func TestPictureNetworkGatewayServesItsMembers(t *testing.T) {
	gw := []clusters.Gateway{{Address: "192.0.2.10", Port: clusters.DefaultGatewayPort}}
	p := layoutPicture([]clusters.Status{
		{ID: "a", Secret: "s", State: clusters.StateReady, Network: "net-x", Gateways: gw},
		{ID: "b", Secret: "s", State: clusters.StateReady, Network: "net-x"},
		{ID: "c", Secret: "s", State: clusters.StateReady, Network: "net-y"},
	}, nil, nil, nil)
	marked := map[string]bool{}
	for _, m := range p.Wide {
		marked[m.ID] = m.NoGateway()
	}
	if marked["a"] || marked["b"] || !marked["c"] {
		t.Errorf("marked without gateway: %v; want c alone", marked)
	}
}
