// Trinity Studio: shared helpers and page switching. Each page script registers itself in
// Studio.pages; no framework, no build step, nothing loaded from the network.
"use strict";
const Studio = {
  pages: {},
  info: null,
  current: null,

  async api(method, url, body) {
    const options = { method, headers: {} };
    if (body !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    const response = await fetch(url, options);
    const type = response.headers.get("Content-Type") || "";
    const data = type.includes("json") ? await response.json() : await response.text();
    if (!response.ok) {
      const error = new Error((data && data.detail) || String(data) || response.statusText);
      error.data = data;
      throw error;
    }
    return data;
  },

  el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  },

  // "#experiences?source=x" -> ["experiences", URLSearchParams]
  route() {
    const hash = location.hash.replace(/^#/, "");
    const [page, query] = hash.split("?");
    return [page || "", new URLSearchParams(query || "")];
  },

  show() {
    let [page, params] = Studio.route();
    if (!Studio.pages[page]) page = Studio.info && Studio.info.experience_file ? "experiences" : "config";
    for (const section of document.querySelectorAll(".page")) section.hidden = section.id !== "page-" + page;
    for (const link of document.querySelectorAll("header nav a")) link.classList.toggle("active", link.dataset.page === page);
    const first = !Studio.pages[page].started;
    Studio.pages[page].started = true;
    Studio.current = page;
    Studio.pages[page].show(params, first);
  },

  fmtTime(seconds) {
    if (!seconds) return "";
    return new Date(seconds * 1000).toLocaleString();
  },

  fmtNum(value) {
    if (value === null || value === undefined) return "";
    if (typeof value !== "number") return String(value);
    return Math.abs(value) >= 1e4 || (value !== 0 && Math.abs(value) < 1e-3) ? value.toExponential(3) : String(+value.toFixed(4));
  },
};

window.addEventListener("hashchange", () => Studio.show());
window.addEventListener("DOMContentLoaded", async () => {
  try {
    Studio.info = await Studio.api("GET", "api/info");
    document.getElementById("root-info").textContent = "checkpoint root: " + Studio.info.root + " · trinity " + Studio.info.version;
  } catch (error) {
    document.getElementById("root-info").textContent = error.message;
  }
  Studio.show();
});
