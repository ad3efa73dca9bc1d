// A small line chart drawn as inline SVG: several series, shared axes, one circle per point
// (each with data-step / data-value, and a tooltip).
"use strict";
Studio.COLORS = ["#2f6fde", "#e5543a", "#2e9e5b", "#9b59b6", "#e0a100", "#16a3b8", "#7f5a3c", "#d6338a"];

Studio.chart = function (title, series, options = {}) {
  // series: [{label, points: [[step, value], ...]}]
  const width = 420, height = 220, left = 52, right = 10, top = 10, bottom = 28;
  const box = Studio.el("div", { class: "chart", "data-title": title });
  box.append(Studio.el("h4", { text: title }));
  const all = series.flatMap((s) => s.points);
  if (!all.length) {
    box.append(Studio.el("div", { class: "empty", text: options.empty || "no data" }));
    return box;
  }
  let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { const pad = Math.abs(y0) * 0.1 || 1; y0 -= pad; y1 += pad; }
  const sx = (x) => left + ((x - x0) / (x1 - x0)) * (width - left - right);
  const sy = (y) => top + (1 - (y - y0) / (y1 - y0)) * (height - top - bottom);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
    return node;
  };
  // axes with 5 ticks each
  add("line", { x1: left, y1: height - bottom, x2: width - right, y2: height - bottom, stroke: "#999" });
  add("line", { x1: left, y1: top, x2: left, y2: height - bottom, stroke: "#999" });
  for (let i = 0; i <= 4; i++) {
    const yv = y0 + ((y1 - y0) * i) / 4, y = sy(yv);
    add("line", { x1: left, y1: y, x2: width - right, y2: y, stroke: "#eee" });
    add("text", { x: left - 4, y: y + 4, "text-anchor": "end", "font-size": 10, fill: "#666" }, Studio.fmtNum(+yv.toPrecision(3)));
  }
  // Step ticks on whole steps only: a rounded label at a fractional position would sit beside
  // the wrong point.
  const stride = Math.max(1, Math.ceil((x1 - x0) / 4));
  for (let xv = Math.ceil(x0); xv <= x1; xv += stride) {
    add("text", { x: sx(xv), y: height - bottom + 14, "text-anchor": "middle", "font-size": 10, fill: "#666" }, String(xv));
  }
  add("text", { x: width - right, y: height - 2, "text-anchor": "end", "font-size": 10, fill: "#666" }, "step");
  const legend = Studio.el("div", { class: "legend" });
  series.forEach((s, i) => {
    const color = Studio.COLORS[i % Studio.COLORS.length];
    const points = [...s.points].sort((a, b) => a[0] - b[0]);
    add("polyline", {
      points: points.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" "),
      fill: "none", stroke: color, "stroke-width": 1.6, class: "series", "data-label": s.label,
    });
    for (const [x, y] of points) {
      const dot = add("circle", { cx: sx(x).toFixed(1), cy: sy(y).toFixed(1), r: points.length > 60 ? 1.2 : 2.4, fill: color, class: "point", "data-series": s.label, "data-step": x, "data-value": y });
      const tip = document.createElementNS(ns, "title");
      tip.textContent = `${s.label}\nstep ${x}: ${y}`;
      dot.append(tip);
    }
    legend.append(Studio.el("span", {}, Studio.el("i", { style: `background:${color}` }), s.label));
  });
  box.append(svg, legend);
  return box;
};
