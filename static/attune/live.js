// Pages that stay current: every element with data-live and an id is refreshed in place from a fresh
// copy of the same page, every data-live-every seconds (on <main>; default 5), while the tab is
// visible. Forms are never replaced, so a filter being typed is not lost; nothing else is touched.
(function () {
  "use strict";
  const main = document.querySelector("main[data-live-every]");
  if (!main) return;
  const everyMs = Math.max(2, Number(main.dataset.liveEvery) || 5) * 1000;
  let busy = false;

  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const response = await fetch(window.location.href, {
        headers: { "X-Requested-With": "live-refresh" },
        credentials: "same-origin",
        cache: "no-store",
      });
      if (!response.ok || response.redirected) return; // signed out, or gone: leave the page as it is
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      for (const old of document.querySelectorAll("[data-live][id]")) {
        const next = fresh.getElementById(old.id);
        if (next && next.innerHTML !== old.innerHTML) {
          old.replaceWith(next);
        }
      }
      main.dataset.liveUpdatedAt = new Date().toISOString();
    } catch (error) {
      // A network hiccup: try again next time.
    } finally {
      busy = false;
    }
  }

  setInterval(refresh, everyMs);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
})();
