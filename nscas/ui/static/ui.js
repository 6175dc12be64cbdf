// nscas ui: the little script the pages use. Served from /static (the CSP allows no inline
// script); it never inserts HTML, only text (textContent), so store strings stay inert.
"use strict";

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function show(value) {
  if (value === null || value === undefined) return "-";
  const text = typeof value === "string" ? value : JSON.stringify(value);
  return text.length > 200 ? text.slice(0, 197) + "..." : text;
}

// ------------------------------------------------------------ verification stream
function startVerify(button) {
  const table = document.getElementById("verify-checks");
  const body = table.querySelector("tbody");
  const summary = document.getElementById("verify-summary");
  body.replaceChildren();
  table.hidden = false;
  button.disabled = true;
  summary.className = "summary";
  summary.textContent = "verifying…";
  let n = 0;
  let finished = false;
  const counts = { passed: 0, failed: 0, skipped: 0 };
  const source = new EventSource(button.dataset.src);
  source.onmessage = (event) => {
    const msg = JSON.parse(event.data);
    if (msg.check) {
      const c = msg.check;
      n += 1;
      counts[c.status] = (counts[c.status] || 0) + 1;
      const row = document.createElement("tr");
      row.className = "check st-row-" + c.status;
      cell(row, String(n), "num");
      cell(row, c.name);
      cell(row, c.status === "skipped" ? "not rechecked" : c.status, "status st-" + c.status);
      cell(row, show(c.claimed));
      cell(row, show(c.recomputed));
      cell(row, c.message || "", "message");
      body.appendChild(row);
      summary.textContent = `verifying… ${counts.passed} passed, ${counts.failed} failed, ${counts.skipped} not rechecked`;
    } else if (msg.done) {
      finished = true;
      summary.textContent = msg.done.summary;
      summary.className = "summary " + (msg.done.ok ? "ok" : "bad");
      summary.dataset.exitCode = String(msg.done.exit_code);
      source.close();
      button.disabled = false;
    } else if (msg.error) {
      finished = true;
      summary.textContent = "cannot verify: " + msg.error.message;
      summary.className = "summary bad";
      summary.dataset.exitCode = String(msg.error.exit_code);
      source.close();
      button.disabled = false;
    }
  };
  source.onerror = () => {
    source.close();
    if (!finished) {
      summary.textContent = "the verification stream stopped before it finished";
      summary.className = "summary bad";
    }
    button.disabled = false;
  };
}

// ------------------------------------------------------------ lineage: pan and zoom
const LEGIBLE = 0.55; // the smallest scale at which a box's text can be read
const READABLE = 0.8; // the scale a graph too big to show whole at LEGIBLE opens at
function setUpGraph(svg) {
  const box = svg.parentElement;
  const width = Number(svg.dataset.width);
  const height = Number(svg.dataset.height);
  let view = { x: 0, y: 0, w: width, h: height };

  function apply() {
    svg.setAttribute("viewBox", `${view.x} ${view.y} ${view.w} ${view.h}`);
  }
  function aspect() {
    const r = box.getBoundingClientRect();
    return r.height > 0 ? r.width / r.height : 1.6;
  }
  function fit() {
    const a = aspect();
    let w = width + 40;
    let h = w / a;
    if (h < height + 40) { h = height + 40; w = h * a; }
    view = { x: -20, y: -20, w: w, h: h };
    apply();
  }
  function zoom(factor, cx, cy) {
    const nx = cx - (cx - view.x) * factor;
    const ny = cy - (cy - view.y) * factor;
    view = { x: nx, y: ny, w: view.w * factor, h: view.h * factor };
    apply();
  }
  function toGraph(clientX, clientY) {
    const r = svg.getBoundingClientRect();
    return { x: view.x + (clientX - r.left) / r.width * view.w,
             y: view.y + (clientY - r.top) / r.height * view.h };
  }
  // The box as tall as the whole graph needs at the page's width, or at the least legible
  // scale when it is wider than that (within limits), so a small graph leaves no empty band
  // and a tall one is not cut short.
  const fullWidth = box.getBoundingClientRect().width;
  const fitScale = fullWidth / (width + 40);
  const wanted = (height + 40) * (fitScale >= LEGIBLE ? Math.min(1, fitScale) : READABLE);
  box.style.height = `${Math.round(Math.max(200, Math.min(wanted, 0.8 * window.innerHeight)))}px`;
  // Start readable: the whole graph if it fits at a legible scale, else around the root.
  fit();
  const pxPerUnit = box.getBoundingClientRect().width / view.w;
  if (pxPerUnit < LEGIBLE) {
    const root = svg.querySelector(".node.root");
    const a = aspect();
    const w = box.getBoundingClientRect().width / READABLE;
    let y = 0;
    if (root) {
      const m = /translate\(([-0-9.]+),([-0-9.]+)\)/.exec(root.getAttribute("transform"));
      if (m) y = Number(m[2]);
    }
    view = { x: -20, y: Math.max(-20, y - w / a / 2), w: w, h: w / a };
    apply();
  }

  svg.addEventListener("wheel", (e) => {
    e.preventDefault();
    const p = toGraph(e.clientX, e.clientY);
    zoom(e.deltaY > 0 ? 1.15 : 1 / 1.15, p.x, p.y);
  }, { passive: false });

  let drag = null;
  let moved = false;
  svg.addEventListener("pointerdown", (e) => {
    if (e.button !== 0) return;
    drag = { x: e.clientX, y: e.clientY, vx: view.x, vy: view.y };
    moved = false;
  });
  window.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (!moved && Math.abs(dx) + Math.abs(dy) < 4) return;
    if (!moved) { moved = true; box.classList.add("dragging"); }
    const r = svg.getBoundingClientRect();
    view.x = drag.vx - dx / r.width * view.w;
    view.y = drag.vy - dy / r.height * view.h;
    apply();
  });
  window.addEventListener("pointerup", () => {
    drag = null;
    box.classList.remove("dragging");
  });
  // A drag that ends on a box is not a click on it.
  svg.addEventListener("click", (e) => {
    if (moved) { e.preventDefault(); e.stopPropagation(); moved = false; }
  }, true);
  for (const b of document.querySelectorAll("[data-zoom]")) {
    b.addEventListener("click", () => {
      const c = { x: view.x + view.w / 2, y: view.y + view.h / 2 };
      if (b.dataset.zoom === "in") zoom(1 / 1.3, c.x, c.y);
      else if (b.dataset.zoom === "out") zoom(1.3, c.x, c.y);
      else fit();
    });
  }
  // Hovering a box marks it and its links.
  for (const node of svg.querySelectorAll(".node")) {
    node.addEventListener("mouseenter", () => node.classList.add("selected"));
    node.addEventListener("mouseleave", () => node.classList.remove("selected"));
  }
}

// ------------------------------------------------------------ forms
function setUpHide(form) {
  const field = document.getElementById("hide-field");
  form.addEventListener("submit", () => {
    const picked = [...form.querySelectorAll(".hide-class:checked")].map((x) => x.value);
    field.value = picked.join(",");
    for (const input of form.querySelectorAll("input[name]")) {
      if (input.value === "" && input.type !== "hidden") input.disabled = true;
    }
    if (field.value === "") field.disabled = true;
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const verify = document.getElementById("verify-button");
  if (verify) verify.addEventListener("click", () => startVerify(verify));
  const svg = document.getElementById("graph-svg");
  if (svg) setUpGraph(svg);
  const hide = document.getElementById("hide-field");
  if (hide) setUpHide(hide.form);
  for (const form of document.querySelectorAll("form.filters")) {
    form.addEventListener("submit", () => {
      for (const el of form.querySelectorAll("select, input:not([type=hidden])")) {
        if (el.value === "") el.disabled = true;
      }
    });
  }
});
