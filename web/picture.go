package web

import (
	"fmt"
	"html/template"
	"math"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/xdsstatus"
	"github.com/hubmesh/hub/trust"
)

// The overview's picture of the federation: the hub in the middle, the home
// cluster and every member around it coloured by state, the xDS clients and
// config subscribers of each member, and the trust domains on the side.
// Members say their Istio network (coloured per network, with a legend of
// the networks) and east-west gateways, and whether they are demoted.
// It is laid out here and drawn by templates/picture.html twice: a wide
// layout for desktops and a compact, stacked one for phones (CSS shows one).
// Every name in it (cluster IDs, proxy IDs, trust domains, messages) is
// untrusted (network names and demotion reasons too) and reaches the page
// only through html/template's escaping.

// Limits that keep the picture legible with many members.
const (
	maxCardMembers    = 8  // up to this many members are drawn as cards, more as dots
	maxWideMembers    = 60 // members drawn in the wide layout; the rest are counted
	maxCompactMembers = 16 // members drawn in the compact layout
	maxTrustShown     = 8  // trust domains drawn
	maxClientMarks    = 6  // a member's clients drawn one by one up to this many
	wideCols          = 10 // members per row in dot mode
	maxNetworksShown  = 12 // networks listed in the legend; the rest are counted
	netPalette        = 6  // network colour classes, net-0 to net-5, reused in turn
)

// Kinds of xDS client, as the picture groups them.
const (
	kindGRPC   = "grpc"   // proxyless gRPC
	kindEnvoy  = "envoy"  // Envoy or another xDS client
	kindIstiod = "istiod" // a member istiod reading config over MCP
)

// tone is how a state looks: a colour class plus a glyph, so that the
// state never rests on colour alone.
type tone struct{ Class, Glyph string }

var (
	toneOK   = tone{"ok", "✓"}
	toneWarn = tone{"warn", "!"}
	toneBad  = tone{"bad", "✕"}
	toneWait = tone{"wait", "…"}
)

func clusterTone(s clusters.State) tone {
	switch s {
	case clusters.StateReady:
		return toneOK
	case clusters.StateStale, clusters.StateTimedOut:
		return toneWarn
	case clusters.StatePending, clusters.StateSyncing:
		return toneWait
	default: // Unreachable, Invalid, Conflict and anything new
		return toneBad
	}
}

func trustTone(s trust.State) tone {
	switch s {
	case trust.StateReady:
		return toneOK
	case trust.StateStale:
		return toneWarn
	case trust.StatePending:
		return toneWait
	default:
		return toneBad
	}
}

// clientMark is one xDS client, or one kind's count when there are many.
type clientMark struct {
	Kind   string
	Title  string // the client's ID, or "3 proxyless gRPC clients"
	Count  int    // 0 for a single client
	X, Y   int    // centre of its shape
	TX     int    // where its count's text starts
	Points string // the triangle of an istiod
}

// IsProxy says the mark is an xDS proxy (not an istiod).
func (m clientMark) IsProxy() bool { return m.Kind != kindIstiod }

// clientGroup is the xDS clients of one member.
type clientGroup struct {
	GRPC, Envoy, Istiod int
	ids                 []clientID // sorted
}

type clientID struct{ kind, id string }

// Proxies counts the member's xDS clients that are not istiods.
func (g clientGroup) Proxies() int { return g.GRPC + g.Envoy }

// Total counts every client of the member.
func (g clientGroup) Total() int { return g.GRPC + g.Envoy + g.Istiod }

func (g *clientGroup) add(p xdsstatus.Proxy) {
	kind := kindOf(p)
	switch kind {
	case kindGRPC:
		g.GRPC++
	case kindEnvoy:
		g.Envoy++
	default:
		g.Istiod++
	}
	if len(g.ids) <= maxClientMarks {
		g.ids = append(g.ids, clientID{kind, p.ID})
	}
}

func kindOf(p xdsstatus.Proxy) string {
	switch {
	case p.ConfigSubscriber:
		return kindIstiod
	case p.Proxyless:
		return kindGRPC
	default:
		return kindEnvoy
	}
}

// Summary says what the group holds, e.g. "2 proxyless gRPC, 1 istiod".
func (g clientGroup) Summary() string {
	var parts []string
	if g.GRPC > 0 {
		parts = append(parts, fmt.Sprintf("%d proxyless gRPC", g.GRPC))
	}
	if g.Envoy > 0 {
		parts = append(parts, fmt.Sprintf("%d Envoy/other xDS", g.Envoy))
	}
	if g.Istiod > 0 {
		parts = append(parts, plural(g.Istiod, "istiod", "istiods"))
	}
	if len(parts) == 0 {
		return "no xDS clients"
	}
	return strings.Join(parts, ", ")
}

// marks lays out the group's clients in a row centred on cx at cy: one
// mark per client when there are few, else one mark per kind with a count.
func (g clientGroup) marks(cx, cy int) []clientMark {
	if g.Total() > maxClientMarks {
		return placeRow(g.counted(), cx-g.countedWidth(44)/2, cy, 44)
	}
	ids := append([]clientID(nil), g.ids...)
	sort.SliceStable(ids, func(i, j int) bool { return kindRank(ids[i].kind) < kindRank(ids[j].kind) })
	out := make([]clientMark, 0, len(ids))
	for _, c := range ids {
		out = append(out, clientMark{Kind: c.kind, Title: kindName(c.kind) + " " + truncateRunes(c.id, 120)})
	}
	return placeRow(out, cx-(len(out)-1)*9-9, cy, 18)
}

// countMarks lays out one mark per kind with its count, in a row of step
// wide slots starting at x.
func (g clientGroup) countMarks(x, cy, step int) []clientMark {
	return placeRow(g.counted(), x, cy, step)
}

// countedWidth is how wide countMarks' row is.
func (g clientGroup) countedWidth(step int) int { return len(g.counted()) * step }

func (g clientGroup) counted() []clientMark {
	var out []clientMark
	for _, k := range []struct {
		kind string
		n    int
	}{{kindGRPC, g.GRPC}, {kindEnvoy, g.Envoy}, {kindIstiod, g.Istiod}} {
		if k.n > 0 {
			out = append(out, clientMark{Kind: k.kind, Count: k.n, Title: fmt.Sprintf("%d × %s", k.n, kindName(k.kind))})
		}
	}
	return out
}

// placeRow puts marks in slots of step starting at x; each mark's shape
// sits at the slot's start, its count (if any) right after it.
func placeRow(marks []clientMark, x, cy, step int) []clientMark {
	for i := range marks {
		m := &marks[i]
		m.X, m.Y = x+9, cy
		m.TX = m.X + 9
		m.Points = fmt.Sprintf("%d,%d %d,%d %d,%d", m.X, cy-7, m.X+7, cy+6, m.X-7, cy+6)
		x += step
	}
	return marks
}

func kindRank(k string) int {
	switch k {
	case kindGRPC:
		return 0
	case kindEnvoy:
		return 1
	}
	return 2
}

func kindName(k string) string {
	switch k {
	case kindGRPC:
		return "proxyless gRPC"
	case kindEnvoy:
		return "Envoy/other xDS"
	}
	return "istiod (config over MCP)"
}

// picMember is one member cluster as the picture shows it.
type picMember struct {
	ID        string
	Label     string // ID, truncated for a card
	Short     string // ID, truncated for a dot
	Home      bool
	State     string
	Tone      tone
	Services  int
	Endpoints int
	Message   string
	Clients   clientGroup
	Network   string // its Istio network, "" for none
	NetLabel  string // Network, truncated for a card or a row
	NetShort  string // Network, truncated for a dot
	NetClass  string // its network's colour class, e.g. "net-2" ("" for none)
	Gateways  int    // its accepted east-west gateways
	// NetGateways says some member of its network has a gateway (the hub
	// reaches the member through any of them).
	NetGateways bool
	Withheld    int // its endpoints that proxies on other networks do not get
	// Certified counts the workload identities of the member whose latest
	// certificate from the hub's CA is valid: its proxyless workloads and
	// the sidecars and gateways its own istiod configures (the hub sees
	// those only through its CA).
	Certified int
	// ProxylessWithheld counts those proxyless gRPC clients on other
	// networks do not get (more than Withheld when no gateway of its
	// network admits them).
	ProxylessWithheld int
	Demoted           string // why its endpoints are served behind the healthy members' ("" when they are not)
}

// NoGateway says the member is on a network on which no member has an
// east-west gateway: proxies on other networks get none of its endpoints.
func (m picMember) NoGateway() bool { return m.Network != "" && m.Gateways == 0 && !m.NetGateways }

// Networking says the member has a network or a gateway to show.
func (m picMember) Networking() bool { return m.Network != "" || m.Gateways > 0 }

// GatewayText is the member's gateway count, e.g. "⇄ 2 gateways", with a
// "!" when a member on a network has none, or "⇄ 2 gw · ! no gRPC" when
// none of its network's gateways admits proxyless gRPC.
func (m picMember) GatewayText() string {
	switch {
	case m.NoGateway():
		return "! no gateway"
	case m.NoProxyless(): // short: it must fit the card
		if m.Gateways == 0 {
			return "no gw · ! no gRPC"
		}
		return fmt.Sprintf("⇄ %d gw · ! no gRPC", m.Gateways)
	case m.Gateways == 0:
		return "no gateway"
	}
	return "⇄ " + plural(m.Gateways, "gateway", "gateways")
}

// NoProxyless says its network has a gateway that proxyless gRPC clients
// of other networks cannot use (none admits their ALPN): they get none of
// its endpoints.
func (m picMember) NoProxyless() bool { return m.ProxylessWithheld > m.Withheld }

// GatewayMark is the member's gateway count for a dot, e.g. "⇄2".
func (m picMember) GatewayMark() string { return fmt.Sprintf("⇄%d", m.Gateways) }

// DemotedTitle is the tooltip of the member's demoted tag.
func (m picMember) DemotedTitle() string { return "Demoted: " + truncateRunes(m.Demoted, 200) }

// rank orders members for drawing when not all fit: the home cluster,
// then members in trouble or demoted, then members whose endpoints other
// networks do not get, then the rest.
func (m picMember) rank() int {
	switch {
	case m.Home:
		return 0
	case m.Tone != toneOK || m.Demoted != "":
		return 1
	case m.NoGateway():
		return 2
	}
	return 3
}

// networking says the member's network and gateways, e.g. "network
// net-east, 1 east-west gateway".
func (m picMember) networking() string {
	s := "no network"
	if m.Network != "" {
		s = "network " + truncateRunes(m.Network, 120)
	}
	if m.Gateways == 0 {
		s += ", no east-west gateway"
	} else {
		s += ", " + plural(m.Gateways, "east-west gateway", "east-west gateways")
	}
	if m.Withheld > 0 {
		s += ", " + plural(m.Withheld, "endpoint", "endpoints") + " withheld from other networks"
	}
	if m.NoProxyless() {
		s += ", " + plural(m.ProxylessWithheld, "endpoint", "endpoints") + " withheld from proxyless gRPC clients of other networks: no gateway of its network admits them" +
			" (deploy/eastwest-proxyless-alpn.yaml, then annotation hub.federation/proxyless-alpn=true on the gateway Service)"
	}
	return s
}

// picNetwork is one Istio network in the legend: the members on it.
type picNetwork struct {
	Name      string
	Label     string // Name, truncated
	Class     string // its colour class, e.g. "net-2"
	Members   int
	Gateways  int // its members' east-west gateways
	NoGateway int // its members without a gateway
}

// Summary is the network's line in the legend, e.g. "2 members · 3 gateways".
func (n picNetwork) Summary() string {
	return plural(n.Members, "member", "members") + " · " + plural(n.Gateways, "gateway", "gateways")
}

// Title is the network's accessible summary.
func (n picNetwork) Title() string {
	s := fmt.Sprintf("Network %s: %s, %s", truncateRunes(n.Name, 120), plural(n.Members, "member", "members"),
		plural(n.Gateways, "east-west gateway", "east-west gateways"))
	if n.NoGateway > 0 {
		s += fmt.Sprintf(" (%d without one: their endpoints are withheld from other networks)", n.NoGateway)
	}
	return s
}

// networks lists the members' networks sorted by name, and gives each
// member its network's colour class: a network's colour is its place in
// that list, so it stays put as long as the set of networks does.
func networks(members []picMember) []picNetwork {
	byName := map[string]*picNetwork{}
	for _, m := range members {
		if m.Network == "" {
			continue
		}
		n := byName[m.Network]
		if n == nil {
			n = &picNetwork{Name: m.Network, Label: truncateRunes(m.Network, 40)}
			byName[m.Network] = n
		}
		n.Members++
		n.Gateways += m.Gateways
		if m.NoGateway() {
			n.NoGateway++
		}
	}
	out := make([]picNetwork, 0, len(byName))
	for _, n := range byName {
		out = append(out, *n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	class := map[string]string{}
	for i := range out {
		out[i].Class = fmt.Sprintf("net-%d", i%netPalette)
		class[out[i].Name] = out[i].Class
	}
	for i := range members {
		members[i].NetClass = class[members[i].Network]
	}
	return out
}

// HubLine says how many clients the hub serves, e.g. "3 proxies · 1 istiod".
func (p picture) HubLine() string {
	return plural(p.Proxies, "proxy", "proxies") + " · " + plural(p.Istiods, "istiod", "istiods")
}

// Title is the member's tooltip and accessible name.
func (m picMember) Title() string {
	s := fmt.Sprintf("%s%s: %s, %s, %s; %s", m.ID, map[bool]string{true: " (home)"}[m.Home], m.State,
		plural(m.Services, "service", "services"), plural(m.Endpoints, "endpoint", "endpoints"), m.Clients.Summary())
	if m.Certified > 0 {
		s += "; " + plural(m.Certified, "workload identity", "workload identities") + " certified by the hub's CA (sidecars of member istiods among them)"
	}
	if m.Networking() {
		s += "; " + m.networking()
	}
	if m.Demoted != "" {
		s += "; demoted: " + truncateRunes(m.Demoted, 200)
	}
	if m.Message != "" {
		s += ". " + truncateRunes(m.Message, 200)
	}
	return s
}

// Counts is the member's one-line service and endpoint count, and the
// identities the hub's CA certifies there, e.g. "4 svc · 8 ep · 3 certs".
func (m picMember) Counts() string {
	s := fmt.Sprintf("%d svc · %d ep", m.Services, m.Endpoints)
	if m.Certified > 0 {
		s += fmt.Sprintf(" · %d certs", m.Certified)
	}
	return s
}

// picTrust is one trust domain.
type picTrust struct {
	Name  string
	Label string
	Local bool
	State string
	Tone  tone
	X, Y  int // top left
	W     int // width
}

// Title is the trust domain's tooltip and accessible name.
func (t picTrust) Title() string {
	if t.Local {
		return fmt.Sprintf("trust domain %s (ours): %s", t.Name, t.State)
	}
	return fmt.Sprintf("federated trust domain %s: %s", t.Name, t.State)
}

// wideNode is a member placed in the wide layout.
type wideNode struct {
	picMember
	X, Y  int // centre
	Marks []clientMark
}

// compactRow is a member placed in the compact layout.
type compactRow struct {
	picMember
	Y     int // top of its row
	Marks []clientMark
}

// line is a straight connector.
type line struct {
	X1, Y1, X2, Y2 int
	Class          string
}

// picture is the whole drawing, in both layouts.
type picture struct {
	Title, Desc string
	Members     int // all members, home included
	Proxies     int // xDS clients that are not istiods
	Istiods     int
	Unassigned  clientGroup // clients of no known member

	// Networks and demotion, in both layouts.
	Networked      bool         // some member has a network or a gateway: every node says its own
	Networks       []picNetwork // the legend's networks, by name
	NetworksHidden int          // networks not in the legend
	NoNetwork      int          // members on no network (when Networked)
	Demoted        int          // demoted members
	Certified      bool         // some member has identities the hub's CA certifies

	// Wide layout (viewBox 0 0 1000 WideH).
	WideH       int
	Cards       bool // members drawn as cards (few) or dots (many)
	CardTop     int  // a card's top, relative to its centre
	CardH       int  // a card's height
	HubX, HubY  int
	Spokes      []line
	Wide        []wideNode
	WideHidden  int
	UnMarks     []clientMark // unassigned clients, under the hub
	Trust       []picTrust
	TrustHidden int
	TrustX      int
	TrustMoreY  int

	// Compact layout (viewBox 0 0 400 CompactH).
	CompactH      int
	RowH          int // a member's row: 2 lines, 3 when networked
	Rows          []compactRow
	CompactHidden int
	CMoreY        int // where the count of hidden members goes
	TrunkY2       int
	CUnassignedY  int
	CUnMarks      []clientMark
	CTrust        []picTrust
	CTrustY       int // the trust domains' heading
	CTrustHidden  int
}

// layoutPicture lays out the federation: members (the home cluster has an
// empty Secret) with the identities the hub's CA certifies in each
// (certified, by member), connected xDS clients and trust domains.
func layoutPicture(sts []clusters.Status, proxies []xdsstatus.Proxy, tds []trust.Status, certified map[string]int) picture {
	members := make([]picMember, 0, len(sts))
	index := map[string]int{}
	for _, st := range sts {
		t := clusterTone(st.State)
		members = append(members, picMember{
			ID: st.ID, Label: truncateRunes(st.ID, 16), Short: truncateRunes(st.ID, 10),
			Home: st.Secret == "", State: string(st.State), Tone: t,
			Services: st.Services, Endpoints: st.Endpoints, Message: st.Message,
			Network: st.Network, NetLabel: truncateRunes(st.Network, 14), NetShort: truncateRunes(st.Network, 10),
			Gateways: len(st.Gateways), Withheld: st.CrossNetworkWithheld, ProxylessWithheld: st.ProxylessWithheld, Demoted: st.Demoted, Certified: certified[st.ID],
		})
	}
	gatewayed := map[string]bool{} // networks on which a member has a gateway
	for _, m := range members {
		if m.Network != "" && m.Gateways > 0 {
			gatewayed[m.Network] = true
		}
	}
	for i := range members {
		members[i].NetGateways = gatewayed[members[i].Network]
	}
	// The home cluster first, then by ID: positions stay put as states change.
	sort.SliceStable(members, func(i, j int) bool {
		if members[i].Home != members[j].Home {
			return members[i].Home
		}
		return members[i].ID < members[j].ID
	})
	for i, m := range members {
		index[m.ID] = i
	}
	p := picture{Members: len(members)}
	for _, m := range members {
		p.Certified = p.Certified || m.Certified > 0
	}
	p.layoutNetworks(members)
	sorted := append([]xdsstatus.Proxy(nil), proxies...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].ID < sorted[j].ID })
	for _, px := range sorted {
		if px.ConfigSubscriber {
			p.Istiods++
		} else {
			p.Proxies++
		}
		if i, ok := index[px.Cluster]; ok && px.Cluster != "" {
			members[i].Clients.add(px)
		} else {
			p.Unassigned.add(px)
		}
	}
	var trusts []picTrust
	for _, td := range tds {
		trusts = append(trusts, picTrust{Name: td.Spec.TrustDomain, Label: truncateRunes(td.Spec.TrustDomain, 21),
			Local: td.Local, State: string(td.State), Tone: trustTone(td.State)})
	}
	sort.SliceStable(trusts, func(i, j int) bool {
		if trusts[i].Local != trusts[j].Local {
			return trusts[i].Local
		}
		return trusts[i].Name < trusts[j].Name
	})
	p.Title, p.Desc = describe(members, p, trusts)
	p.layoutWide(members, trusts)
	p.layoutCompact(members, trusts)
	return p
}

// layoutNetworks sets the members' network colours, the legend of networks
// and the counts of members on no network and demoted.
func (p *picture) layoutNetworks(members []picMember) {
	all := networks(members)
	if len(all) > maxNetworksShown {
		p.NetworksHidden = len(all) - maxNetworksShown
		all = all[:maxNetworksShown]
	}
	p.Networks = all
	for _, m := range members {
		p.Networked = p.Networked || m.Networking()
		if m.Network == "" {
			p.NoNetwork++
		}
		if m.Demoted != "" {
			p.Demoted++
		}
	}
	if !p.Networked {
		p.NoNetwork = 0
	}
}

// shown picks at most n members to draw, in their order: the home cluster,
// members in trouble or demoted, then members without the gateway their
// network needs first, so that a problem is never among the hidden.
func shown(members []picMember, n int) []picMember {
	if len(members) <= n {
		return members
	}
	idx := make([]int, len(members))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return members[idx[a]].rank() < members[idx[b]].rank() })
	idx = idx[:n]
	sort.Ints(idx)
	out := make([]picMember, 0, n)
	for _, i := range idx {
		out = append(out, members[i])
	}
	return out
}

func (p *picture) layoutWide(members []picMember, trusts []picTrust) {
	drawn := shown(members, maxWideMembers)
	p.WideHidden = len(members) - len(drawn)
	p.TrustX = 805
	p.Cards = len(drawn) <= maxCardMembers
	switch {
	case len(drawn) == 0:
		p.WideH, p.HubX, p.HubY = 200, 395, 70
	case p.Cards:
		// Cards on an ellipse around the hub, the home cluster at the top;
		// networked cards have two more lines (network, gateways).
		p.WideH, p.HubX, p.HubY, p.CardTop, p.CardH = 530, 395, 265, -33, 66
		ry := 185.0
		if p.Networked {
			p.WideH, p.HubY, p.CardTop, p.CardH, ry = 570, 285, -49, 98, 200
		}
		const rx = 290.0
		for i, m := range drawn {
			x, y := ellipse(p.HubX, p.HubY, rx, ry, i, len(drawn))
			n := wideNode{picMember: m, X: x, Y: y}
			// The clients sit on the card's outer side, clear of the
			// demoted tag astride its top edge.
			my := y + p.CardTop + p.CardH + 20
			if y < p.HubY {
				my = y + p.CardTop - 20
			}
			n.Marks = m.Clients.marks(x, my)
			p.Wide = append(p.Wide, n)
			p.Spokes = append(p.Spokes, line{p.HubX, p.HubY, x, y, "spoke tone-" + m.Tone.Class})
		}
	default:
		// Dots in rows of ten, half the rows above the hub and half below;
		// networked dots have their network under their name.
		rows := (len(drawn) + wideCols - 1) / wideCols
		above := (rows + 1) / 2
		const top = 36
		rowH, markY := 74, 46
		if p.Networked {
			rowH, markY = 92, 62
		}
		p.HubX = 395
		p.HubY = top + above*rowH + 40
		for i, m := range drawn {
			r, c := i/wideCols, i%wideCols
			inRow := min(wideCols, len(drawn)-r*wideCols)
			x := 395 - (inRow-1)*78/2 + c*78
			y := top + r*rowH
			if r >= above {
				y = p.HubY + 40 + 44 + (r-above)*rowH
			}
			n := wideNode{picMember: m, X: x, Y: y}
			n.Marks = m.Clients.countMarks(x-m.Clients.countedWidth(28)/2, y+markY, 28)
			p.Wide = append(p.Wide, n)
			p.Spokes = append(p.Spokes, line{p.HubX, p.HubY, x, y, "spoke faint tone-" + m.Tone.Class})
		}
		p.WideH = p.HubY + 84 + (rows-above)*rowH - 8
	}
	// Clients of no known member sit in the hub's box.
	p.UnMarks = p.Unassigned.marks(p.HubX, p.HubY+30)
	// Trust domains in a column on the right.
	y := 48
	for i, t := range trusts {
		if i == maxTrustShown {
			p.TrustHidden = len(trusts) - i
			break
		}
		t.X, t.Y, t.W = p.TrustX, y, 188
		p.Trust = append(p.Trust, t)
		y += 50
	}
	p.TrustMoreY = y + 14
	p.WideH = max(p.WideH, y+30)
}

func (p *picture) layoutCompact(members []picMember, trusts []picTrust) {
	drawn := shown(members, maxCompactMembers)
	p.CompactHidden = len(members) - len(drawn)
	p.RowH = 52
	if p.Networked {
		p.RowH = 70
	}
	step := p.RowH + 10
	if p.Demoted > 0 {
		step += 6 // room for the demoted tags astride the rows' top edges
	}
	y := 84 // below the hub
	if p.Unassigned.Total() > 0 {
		p.CUnassignedY = y
		p.CUnMarks = p.Unassigned.countMarks(382-p.Unassigned.countedWidth(40), y+14, 40)
		y += 36
	}
	for _, m := range drawn {
		p.Rows = append(p.Rows, compactRow{picMember: m, Y: y,
			Marks: m.Clients.countMarks(382-m.Clients.countedWidth(40), 21, 40)})
		y += step
	}
	p.TrunkY2 = y - step + p.RowMid()
	if len(drawn) == 0 {
		p.TrunkY2 = 0
	}
	if p.CompactHidden > 0 {
		p.CMoreY = y + 12
		y += 30
	}
	if len(trusts) > 0 {
		p.CTrustY = y + 18
		y += 30
		for i, t := range trusts {
			if i == maxTrustShown {
				p.CTrustHidden = len(trusts) - i
				y += 24
				break
			}
			t.X, t.Y, t.W = 10, y, 380
			p.CTrust = append(p.CTrust, t)
			y += 44
		}
	}
	p.CompactH = y + 8
}

// NoNetworkText is the legend's line for the members on no network.
func (p picture) NoNetworkText() string {
	return "no network: " + plural(p.NoNetwork, "member", "members")
}

// RowMid is the middle of a compact row, where its branch joins the trunk.
func (p picture) RowMid() int { return p.RowH / 2 }

// ellipse places the i-th of n points on an ellipse, the first at the top,
// going clockwise.
func ellipse(cx, cy int, rx, ry float64, i, n int) (int, int) {
	a := -90.0 + 360.0*float64(i)/float64(n)
	s, c := math.Sincos(a * math.Pi / 180)
	return cx + int(math.Round(rx*c)), cy + int(math.Round(ry*s))
}

// describe writes the picture's accessible title and summary.
func describe(members []picMember, p picture, trusts []picTrust) (string, string) {
	byState := map[string]int{}
	for _, m := range members {
		byState[m.State]++
	}
	var states []string
	for _, c := range sortedCounts(byState) {
		states = append(states, fmt.Sprintf("%d %s", c.N, c.Key))
	}
	title := fmt.Sprintf("Federation: %s", plural(len(members), "member", "members"))
	if nets := len(p.Networks) + p.NetworksHidden; nets > 0 {
		title += " on " + plural(nets, "network", "networks")
		if p.NoNetwork > 0 {
			title += fmt.Sprintf(", %d on none", p.NoNetwork)
		}
	}
	if len(states) > 0 {
		title += " (" + strings.Join(states, ", ") + ")"
	}
	title += fmt.Sprintf(", %s, %s connected to the hub", plural(p.Proxies, "proxy", "proxies"), plural(p.Istiods, "istiod", "istiods"))
	var b strings.Builder
	drawn := shown(members, maxWideMembers)
	for _, m := range drawn {
		fmt.Fprintf(&b, "%s. ", m.Title())
	}
	if n := len(members) - len(drawn); n > 0 {
		fmt.Fprintf(&b, "And %s. ", plural(n, "more member", "more members"))
	}
	for _, n := range p.Networks {
		fmt.Fprintf(&b, "%s. ", n.Title())
	}
	if p.NetworksHidden > 0 {
		fmt.Fprintf(&b, "And %s. ", plural(p.NetworksHidden, "more network", "more networks"))
	}
	if p.Unassigned.Total() > 0 {
		fmt.Fprintf(&b, "Not tied to a member: %s. ", p.Unassigned.Summary())
	}
	for _, t := range trusts {
		fmt.Fprintf(&b, "%s. ", strings.ToUpper(t.Title()[:1])+t.Title()[1:])
	}
	return title, strings.TrimSpace(b.String())
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// truncateRunes cuts s to at most n characters, marking the cut with "…".
func truncateRunes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// clientsView is what the picture-clients template draws: one member's
// (or the unassigned) clients.
type clientsView struct {
	Cluster string
	Group   clientGroup
	Marks   []clientMark
	Class   string // extra classes, e.g. " unassigned"
}

// pictureFuncs are the picture templates' helpers.
var pictureFuncs = template.FuncMap{
	"add": func(a, b int) int { return a + b },
	"clients": func(cluster string, g clientGroup, marks []clientMark, class string) clientsView {
		return clientsView{cluster, g, marks, class}
	},
}
