// agentq dashboard: live updates from the job event streams (server-sent events).
"use strict";

// The API names each server-sent event by its type (`event: turn_end`), and EventSource
// hands named events only to listeners of that name.
const EVENT_TYPES = [
  "job_start", "turn_start", "message_start", "message_end", "message_delta",
  "tool_execution_start", "tool_execution_end", "turn_end", "job_end", "job_redriven",
  "cancel_requested", "steering_queued", "steering_injected", "steering_deferred",
  "replay_diverged", "compaction_start", "compaction_end", "limit_reached",
  "waiting_provider", "approval_required", "approval_resolved",
];

const LIVE = ["queued", "running", "waiting"];

function onEvents(source, handler) {
  for (const type of EVENT_TYPES) source.addEventListener(type, handler);
  source.onmessage = handler;
}

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function followJob(root) {
  // A job page: append each new event to the timeline; reload once the job has ended, so
  // the answer, the usage and the buttons are the final ones.
  const tbody = document.querySelector("#timeline tbody");
  const status = document.getElementById("job-status");
  const url = root.dataset.eventsUrl + "?after=" + encodeURIComponent(root.dataset.lastSeq);
  const source = new EventSource(url);
  // A form sent from this page (Approve, Deny, Cancel, Replay) navigates to the page's new
  // state: from then on no event reloads the old one, which would cancel that navigation
  // and lose its answer (on a slow server the event comes before the form's redirect).
  let leaving = false;
  document.addEventListener("submit", () => { leaving = true; source.close(); });
  const reloadSoon = () => window.setTimeout(() => {
    if (!leaving) window.location.reload();
  }, 300);
  let redraw = null;
  const redrawWaterfall = () => {
    // the waterfall is drawn by the server: read it again (that part of the page alone)
    if (redraw) return;
    redraw = window.setTimeout(async () => {
      redraw = null;
      const response = await fetch(window.location.pathname + "?part=waterfall",
                                   {credentials: "same-origin"});
      if (!response.ok) return;
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html")
        .getElementById("waterfall");
      const shown = document.getElementById("waterfall");
      if (fresh && shown && !shown.querySelector("details[open]")) shown.replaceWith(fresh);
    }, 500);
  };
  onEvents(source, (message) => {
    const event = JSON.parse(message.data);
    if (event.type !== "message_delta") redrawWaterfall();
    const row = document.createElement("tr");
    row.append(cell(String(event.seq), "num"), cell(event.created_at.slice(11, 23)),
               cell(event.type));
    const details = document.createElement("td");
    const pre = document.createElement("pre");
    pre.textContent = JSON.stringify(event.data, null, 2);
    details.append(pre);
    row.append(details);
    tbody.append(row);
    if (event.type === "job_start" || event.type === "turn_start") {
      status.textContent = "running";
    }
    if (event.type === "approval_required" || event.type === "approval_resolved") {
      // the Approve / Deny buttons are rendered by the server
      source.close();
      reloadSoon();
    }
    if (event.type === "job_end") {
      source.close();
      status.textContent = event.data.status || "ended";
      reloadSoon();
    }
  });
  // the stream closes after job_end; EventSource would reconnect: the handler above closes it
}

function followList(table) {
  // The jobs list: follow up to four live jobs through their event streams, and refresh the
  // rows when one ends and every few seconds (new jobs).
  const tbody = table.querySelector("tbody");
  const streams = new Map();
  const refresh = async () => {
    const response = await fetch(table.dataset.rowsUrl, {credentials: "same-origin"});
    if (response.ok) {
      tbody.innerHTML = await response.text();
      watch();
    }
  };
  const watch = () => {
    for (const row of tbody.querySelectorAll("tr[data-job]")) {
      const id = row.dataset.job;
      const live = LIVE.includes(row.dataset.status);
      if (!live || streams.has(id) || streams.size >= 4) continue;
      const source = new EventSource("/ui/jobs/" + id + "/events");
      streams.set(id, source);
      onEvents(source, (message) => {
        const event = JSON.parse(message.data);
        if (event.type === "job_end" || event.type === "job_start") {
          if (event.type === "job_end") {
            source.close();
            streams.delete(id);
          }
          refresh();
        }
      });
    }
  };
  watch();
  window.setInterval(refresh, 5000);
}

function followOverview(root) {
  // The overview: its numbers read again every few seconds (a fragment of the page, as the
  // server renders it), unless paused.
  const pause = document.getElementById("overview-pause");
  const said = document.getElementById("overview-refresh");
  const every = Number(root.dataset.refreshS || "10") * 1000;
  const refresh = async () => {
    if (pause && pause.checked) return;
    try {
      const response = await fetch(root.dataset.partUrl, {credentials: "same-origin"});
      if (response.ok) {
        root.innerHTML = await response.text();
        said.textContent = "Refreshed " + new Date().toLocaleTimeString();
      } else {
        said.textContent = "Not refreshed (HTTP " + response.status + ")";
      }
    } catch (error) {
      said.textContent = "Not refreshed (the server did not answer)";
    }
  };
  window.setInterval(refresh, every);
  if (pause) {
    pause.addEventListener("change", () => {
      said.textContent = pause.checked ? "Paused" : "Refreshes every " + every / 1000 + " s";
    });
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const job = document.getElementById("job");
  if (job && LIVE.includes(job.dataset.status)) {
    followJob(job);
  }
  const jobs = document.getElementById("jobs");
  if (jobs) followList(jobs);
  const overview = document.getElementById("overview");
  if (overview) followOverview(overview);
});
