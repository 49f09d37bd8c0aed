// Live updates: the server sends a page's main content whenever it changes.
(function () {
  "use strict";
  var main = document.getElementById("main");
  var status = document.getElementById("live-status");
  if (!main || !main.dataset.live || !window.EventSource) { return; }
  var src = new EventSource("/events?page=" + encodeURIComponent(location.pathname));
  var first = true;
  src.addEventListener("update", function (ev) {
    if (first) { first = false; } // the first event repeats what the page already shows
    var active = document.activeElement;
    var inMain = main.contains(active);
    // Forms live outside the live fragment: keep them, replace the rest.
    var live = main.querySelector("[data-fragment]");
    if (!live) {
      live = document.createElement("div");
      live.setAttribute("data-fragment", "");
      var forms = [];
      Array.prototype.forEach.call(main.children, function (c) {
        if (c.tagName === "SECTION" && c.querySelector("form")) { forms.push(c); }
      });
      while (main.firstChild) { main.removeChild(main.firstChild); }
      main.appendChild(live);
      forms.forEach(function (f) { main.appendChild(f); });
    }
    live.innerHTML = ev.data;
    if (inMain && !main.contains(active)) { main.focus(); }
    if (status) { status.textContent = "Live · updated " + new Date().toLocaleTimeString(); }
  });
  // The server ends the stream for good when the session is over (signed
  // out elsewhere, expired or revoked) or when newer pages of the session
  // took its place; the reason is plain text.
  src.addEventListener("end", function (ev) {
    src.close();
    if (status) { status.textContent = "Live updates stopped: " + ev.data + ". Reload the page to resume."; }
  });
  src.onopen = function () { if (status) { status.textContent = "Live updates on"; } };
  // A refused stream (the hub at its limit of live pages) is closed by the
  // browser for good; a dropped one is retried.
  src.onerror = function () {
    if (!status) { return; }
    status.textContent = src.readyState === EventSource.CLOSED ?
      "Live updates unavailable right now. Reload the page later." : "Live updates reconnecting…";
  };
})();
