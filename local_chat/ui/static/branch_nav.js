const conversation = () => document.querySelector(".conversation");
const keyOf = (p) => `${p.node}:${p.siblings.join(",")}`;
const send = (what, node) => {
  props.value = {...props.value, action: {do: what, node: node, at: Date.now()}};
  trigger("branch");
};
const button = (label, title, what, node, extra) => {
  const b = document.createElement("button");
  b.type = "button"; b.textContent = label; b.title = title; b.className = extra || "";
  b.setAttribute("aria-label", title);
  if (node === undefined) { b.disabled = true; return b; }
  b.addEventListener("click", (event) => {
    event.stopPropagation();
    if (what === "delete" && !confirm("Remove this message and everything under it? It cannot be undone.")) return;
    send(what, node);
  });
  return b;
};
const bar = (p) => {
  const div = document.createElement("div");
  div.className = "branch-bar"; div.dataset.key = keyOf(p);
  const at = p.siblings.indexOf(p.node), count = p.siblings.length;
  if (count > 1) {
    const where = document.createElement("span");
    where.textContent = `${at + 1}/${count}`;
    div.append(button("‹", "Previous version", "go", p.siblings[at - 1]), where,
               button("›", "Next version", "go", p.siblings[at + 1]));
  }
  div.append(button("Fork", "Fork: a new conversation down to this message", "fork", p.node, "on-hover"),
             button("Remove", "Remove this message and everything under it", "delete", p.node, "on-hover"));
  return div;
};
const place = () => {
  const box = conversation();
  if (!box) return;
  const messages = box.querySelectorAll('[data-testid="user"], [data-testid="bot"]');
  const wanted = new Map();
  for (const p of (props.value && props.value.points) || []) if (messages[p.index]) wanted.set(messages[p.index], p);
  box.querySelectorAll(".branch-bar").forEach((b) => {
    const p = wanted.get(b.previousElementSibling);
    if (!p || b.dataset.key !== keyOf(p)) b.remove();
  });
  for (const [message, p] of wanted) {
    const next = message.nextElementSibling;
    if (!(next && next.classList.contains("branch-bar"))) message.after(bar(p));
  }
};
let queued = false;
new MutationObserver(() => {
  if (queued) return;
  queued = true;
  requestAnimationFrame(() => { queued = false; place(); });
}).observe(document.body, {subtree: true, childList: true});
watch("value", place);
place();
