// The live parts of the Mediator's pages, in a few lines and no build step
// (docs/pages.md#pages-for-people). Without JavaScript the pages still work; only these parts then
// wait for a reload.
(function () {
  "use strict";
  var PAGE_SECONDS = 3;  // how often a page's live parts are read again
  var LOG_SECONDS = 1;   // how often a running step's log is asked for its new bytes

  // Every element with data-live-part is replaced by its newer self from the same page.
  function refreshParts() {
    if (!document.querySelector("[data-live-part]")) return;
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (resp) { return resp.ok ? resp.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live-part]").forEach(function (old) {
          var next = fresh.getElementById(old.id);
          if (next) old.replaceWith(document.importNode(next, true));
        });
        fresh.querySelectorAll("pre[data-log]").forEach(function (next) {
          var mine = document.getElementById(next.id);
          if (mine) mine.dataset.state = next.dataset.state;
        });
      })
      .catch(function () {});
  }

  // A step's log, appended from the log route's offsets: ?from= the bytes already shown. Read
  // every second while the step runs, every few while it waits, once more after it ended.
  var OPEN = { PENDING: true, CLAIMED: true, ASKED: true };
  function followLog(pre) {
    function poll() {
      var offset = Number(pre.dataset.from || "0");
      var state = pre.dataset.state;
      fetch(pre.dataset.log + "?from=" + offset, { credentials: "same-origin", cache: "no-store" })
        .then(function (resp) {
          if (!resp.ok) return null;
          var total = resp.headers.get("X-Enode-Log-Bytes");
          return resp.text().then(function (text) {
            if (text) pre.textContent += text;
            if (total !== null) pre.dataset.from = total;
          });
        })
        .catch(function () {})
        .then(function () {
          pre.dataset.loaded = "1";
          if (OPEN[state]) {
            setTimeout(poll, (state === "CLAIMED" ? LOG_SECONDS : PAGE_SECONDS) * 1000);
          } else if (pre.dataset.state !== state) {
            setTimeout(poll, 0);  // it ended while we read: what it wrote last
          }
        });
    }
    poll();
  }

  document.querySelectorAll("pre[data-log]").forEach(followLog);
  setInterval(refreshParts, PAGE_SECONDS * 1000);
})();
