// The page of the Videos API: submit a prompt (with keyframes or references: a multipart body),
// follow the job (progress, previews), play the result beside its inputs, list the jobs. Plain
// JavaScript over the same /v1 routes as any client; media are fetched with the API key and shown
// through object URLs. While the server cannot be reached (restarting, a proxy answering 502-504)
// the page says "reconnecting" and keeps polling, backing off, and goes on where it was: jobs
// outlive a front end restart.
"use strict";

const $ = (id) => document.getElementById(id);
const ACTIVE = ["queued", "in_progress"];
const POLL_MS = 250;
const LIST_MS = 2000;
// the file pickers: element id -> the create field its files go in
const PICKERS = {
  "first-frame": "input_reference",
  "last-frame": "last_frame",
  "reference-images": "reference_images",
  "reference-audio": "reference_audio",
};
const INPUT_NAMES = {
  first_frame: "first frame",
  last_frame: "last frame",
  reference_image: "reference image",
  reference_video: "reference video",
  reference_audio: "reference audio",
};
const RETRY_MS = [500, 1000, 2000, 4000]; // waits between polls while the server cannot be reached
const RETRY_STATUSES = [502, 503, 504];
let current = null; // id of the job shown
let shownPreview = null; // its preview step on screen
let shownInputs = null; // the id of the job whose inputs are on screen
let objectUrls = [];
let listFailed = false; // the error shown is the list's

$("api-key").value = localStorage.getItem("h3-api-key") || "";
$("api-key").addEventListener("change", () => {
  localStorage.setItem("h3-api-key", $("api-key").value.trim());
  showError("");
  refreshList();
});

// An error of api(); `retry`: the server could not be reached or answered 502-504, asking again may work.
class ApiFailure extends Error {
  constructor(message, retry) {
    super(message);
    this.retry = retry;
  }
}

// The Authorization header of a key: a header holds characters up to U+00FF only (a browser sends
// them as Latin-1 bytes, which the server accepts), so a key with others (Cyrillic, emoji) goes
// percent-encoded as UTF-8 after "UTF-8''" (RFC 8187's form; docs/videos_api.md, Security).
function authorization(key) {
  return /^[\u0000-\u00ff]*$/.test(key) ? `Bearer ${key}` : `Bearer UTF-8''${encodeURIComponent(key)}`;
}

async function api(path, options = {}) {
  const key = $("api-key").value.trim();
  const headers = Object.assign({}, options.headers || {}, key ? { Authorization: authorization(key) } : {});
  let response;
  try {
    response = await fetch(path, Object.assign({}, options, { headers }));
  } catch (error) {
    throw new ApiFailure(`the server cannot be reached (${error.message})`, true);
  }
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      message = (await response.json()).error.message;
    } catch (ignored) {
      // not an API error body: keep the status line
    }
    throw new ApiFailure(message, RETRY_STATUSES.includes(response.status));
  }
  return response;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function blobUrl(path) {
  const url = URL.createObjectURL(await (await api(path)).blob());
  objectUrls.push(url);
  return url;
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

$("form").addEventListener("submit", async (event) => {
  event.preventDefault();
  showError("");
  const body = { prompt: $("prompt").value };
  const fields = { size: "size", seconds: "seconds", num_inference_steps: "steps", seed: "seed", fit: "fit" };
  for (const [name, id] of Object.entries(fields)) {
    const value = $(id).value.trim();
    if (value) body[name] = ["size", "seconds", "fit"].includes(name) ? value : Number(value);
  }
  // the server's LoRA adapters, each NAME or NAME:SCALE, comma-separated (docs/lora.md)
  const loras = $("lora").value.split(",").map((entry) => entry.trim()).filter(Boolean);
  if (loras.length) body.lora = loras;
  const files = Object.entries(PICKERS).flatMap(([id, name]) => Array.from($(id).files, (file) => [name, file]));
  let request = { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
  if (files.length) {
    // files go as a multipart body (the browser sets its Content-Type with the boundary)
    const form = new FormData();
    for (const [name, value] of Object.entries(body)) for (const item of [value].flat()) form.append(name, String(item));
    for (const [name, file] of files) form.append(name, file, file.name);
    request = { method: "POST", body: form };
  }
  $("generate").disabled = true;
  try {
    const response = await api("/v1/videos", request);
    show((await response.json()).id);
    refreshList();
  } catch (error) {
    showError(error.message);
  } finally {
    $("generate").disabled = false;
  }
});

function show(id) {
  current = id;
  shownPreview = null;
  shownInputs = null;
  objectUrls.forEach((url) => URL.revokeObjectURL(url));
  objectUrls = [];
  $("job").hidden = false;
  $("job-id").textContent = id;
  $("progress").value = 0;
  $("preview").removeAttribute("src");
  $("preview-caption").textContent = "preview";
  $("task").textContent = "";
  $("inputs").replaceChildren();
  $("video").removeAttribute("src");
  $("video").load();
  for (const link of ["download-mp4", "download-wav"]) $(link).removeAttribute("href");
  follow(id);
}

async function follow(id) {
  let failures = 0;
  while (current === id) {
    let job;
    try {
      job = await (await api(`/v1/videos/${id}`)).json();
      failures = 0;
    } catch (error) {
      if (current !== id) return;
      $("status").textContent = error.retry ? `reconnecting: ${error.message}` : error.message;
      if (!error.retry) return;
      await sleep(RETRY_MS[Math.min(failures++, RETRY_MS.length - 1)]);
      continue;
    }
    if (current !== id) return;
    render(job);
    if (shownInputs !== id) {
      shownInputs = id;
      if (!(await showInputs(job)) && current === id) shownInputs = null; // unreachable: the next poll tries again
    }
    if (job.preview_step !== null && job.preview_step !== shownPreview) {
      shownPreview = job.preview_step;
      try {
        $("preview").src = await blobUrl(`/v1/videos/${id}/content?variant=preview`);
        $("preview-caption").textContent = `preview after step ${job.preview_step}`;
      } catch (ignored) {
        // deleted meanwhile: the next poll says so
      }
    }
    if (!ACTIVE.includes(job.status)) {
      if (job.status === "completed") await showResult(id);
      refreshList();
      return;
    }
    await sleep(POLL_MS);
  }
}

function render(job) {
  $("task").textContent = job.task;
  $("progress").value = job.progress;
  let text = job.status;
  if (job.status === "queued" && job.queue_position) text += `, position ${job.queue_position} in the queue`;
  if (job.total_steps) text += `, step ${job.step} of ${job.total_steps}`;
  text += ` (${job.progress} %)`;
  if (job.error) text += `: ${job.error.message}`;
  $("status").textContent = text;
  $("status").className = `status-${job.status}`;
  $("cancel").hidden = !ACTIVE.includes(job.status);
  $("outside-training").textContent = outsideNote(job);
  $("outside-training").hidden = !job.outside_training;
}

// The note on a request outside what the weights were trained on (the result INFO's
// outside_training: sizes, length, unknown words), or "" when it was inside or is unknown.
function outsideNote(job) {
  if (!job.outside_training) return "";
  return `outside what the model was trained on: ${job.outside_training.join("; ")}`;
}

// The files the job was sent (first / last frame, references), as the API keeps them. Returns
// false when the server could not be reached for one of them (a missing one is left out).
async function showInputs(job) {
  const figures = [];
  let reached = true;
  for (const input of job.inputs) {
    const figure = document.createElement("figure");
    const kind = input.media_type.split("/")[0];
    const element = document.createElement(kind === "image" ? "img" : kind === "audio" ? "audio" : "video");
    element.className = `input input-${input.variant}`;
    if (kind !== "image") element.controls = true;
    else element.alt = INPUT_NAMES[input.variant];
    try {
      element.src = await blobUrl(input.url);
    } catch (error) {
      reached = reached && !error.retry;
      continue; // deleted meanwhile (the next poll says so), or the server is unreachable
    }
    const caption = document.createElement("figcaption");
    const several = job.inputs.filter((other) => other.variant === input.variant).length > 1;
    caption.textContent = INPUT_NAMES[input.variant] + (several ? ` ${input.index + 1}` : "");
    figure.append(element, caption);
    figures.push(figure);
  }
  if (current === job.id) $("inputs").replaceChildren(...figures);
  return reached;
}

async function showResult(id) {
  const video = await blobUrl(`/v1/videos/${id}/content`);
  $("video").src = video;
  $("download-mp4").href = video;
  $("download-mp4").download = `${id}.mp4`;
  $("download-wav").href = await blobUrl(`/v1/videos/${id}/content?variant=audio`);
  $("download-wav").download = `${id}.wav`;
}

$("cancel").addEventListener("click", async () => {
  try {
    render(await (await api(`/v1/videos/${current}/cancel`, { method: "POST" })).json());
  } catch (error) {
    showError(error.message);
  }
});

function button(label, action) {
  const element = document.createElement("button");
  element.type = "button";
  element.className = "small";
  element.textContent = label;
  element.addEventListener("click", action);
  return element;
}

async function refreshList() {
  let page;
  try {
    page = await (await api("/v1/videos?limit=20")).json();
  } catch (error) {
    showError(error.message);
    listFailed = true;
    return;
  }
  if (listFailed) {
    showError(""); // the server answers again
    listFailed = false;
  }
  const rows = page.data.map((job) => {
    const row = document.createElement("tr");
    row.dataset.id = job.id;
    const created = new Date(job.created_at * 1000).toLocaleTimeString();
    const status = `${job.status} ${job.progress} %`;
    const cells = [created, job.prompt, job.task, job.size || "", job.seconds || "", job.seed, status];
    cells.forEach((value, i) => {
      const cell = document.createElement("td");
      cell.textContent = value;
      if (i === 1) cell.className = "prompt";
      if (i === 1 && job.outside_training) {
        const note = document.createElement("div");
        note.className = "note";
        note.textContent = outsideNote(job);
        cell.appendChild(note);
      }
      if (i === 6) cell.className = `status-${job.status}`;
      row.appendChild(cell);
    });
    const actions = document.createElement("td");
    actions.appendChild(button("show", () => show(job.id)));
    actions.appendChild(
      button("delete", async () => {
        try {
          await api(`/v1/videos/${job.id}`, { method: "DELETE" });
          if (current === job.id) {
            current = null;
            $("job").hidden = true;
          }
        } catch (error) {
          showError(error.message);
        }
        refreshList();
      })
    );
    row.appendChild(actions);
    return row;
  });
  $("jobs").replaceChildren(...rows);
}

refreshList();
setInterval(refreshList, LIST_MS);
