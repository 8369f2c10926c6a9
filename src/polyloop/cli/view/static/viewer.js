/* PolyLoop viewer: live updates, expand/collapse. No dependencies; pages work without it. */
(function () {
  "use strict";
  var body = document.body;

  function openStepFromHash() {
    var id = decodeURIComponent(location.hash.slice(1));
    if (id.indexOf("step-") !== 0) return;
    var el = document.getElementById(id);
    if (el && el.tagName === "DETAILS") {
      el.open = true;
      el.scrollIntoView({ block: "start" });
    }
  }
  window.addEventListener("hashchange", openStepFromHash);
  openStepFromHash();

  document.addEventListener("click", function (ev) {
    var button = ev.target.closest ? ev.target.closest("[data-expand]") : null;
    if (!button) return;
    var open = button.getAttribute("data-expand") === "all";
    var steps = document.querySelectorAll("details.step");
    for (var i = 0; i < steps.length; i++) steps[i].open = open;
  });

  function poll(url, every, onData) {
    var timer = null;
    function tick() {
      fetch(url, { headers: { Accept: "application/json" }, cache: "no-store" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) {
          var next = data ? onData(data) : every;
          if (next) timer = setTimeout(tick, next);
        })
        .catch(function () { timer = setTimeout(tick, every * 2); });
    }
    timer = setTimeout(tick, every);
    return function () { clearTimeout(timer); };
  }

  // Runs list: refresh the rows while runs are in progress (slowly otherwise: new runs).
  var listUrl = body.getAttribute("data-poll");
  if (listUrl) {
    var version = body.getAttribute("data-version");
    var live = Number(body.getAttribute("data-live") || 0);
    poll(listUrl, live ? 2000 : 10000, function (data) {
      if (data.version !== version) {
        version = data.version;
        document.getElementById("runs-body").innerHTML = data.tbody;
        document.getElementById("run-count").textContent = data.summary;
        body.setAttribute("data-version", version);
      }
      document.getElementById("live-count").textContent = data.live_note;
      body.setAttribute("data-live", String(data.live));
      return data.live ? 2000 : 10000;
    });
  }

  // Run page of a run that has not ended: show new steps as they land.
  var runUrl = body.getAttribute("data-poll-run");
  if (runUrl) {
    var token = body.getAttribute("data-token");
    var lastPage = body.getAttribute("data-last-page") === "1";
    poll(runUrl, 2000, function (data) {
      if (data.token === token) return data.state === "live" ? 2000 : 10000;
      if (lastPage) { location.reload(); return 0; }
      var note = document.getElementById("new-steps");
      if (!note) {
        note = document.createElement("div");
        note.id = "new-steps";
        note.className = "notice live";
        document.querySelector("main").prepend(note);
      }
      note.textContent = "The run has moved on: " + data.steps_used + " steps (" +
        (data.stop_reason || data.state) + "). Reload to see them.";
      token = data.token;
      return data.state === "live" ? 2000 : 0;
    });
  }
})();
