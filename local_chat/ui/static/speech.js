// The page's speech (ui/voice.py): the clips of the value's round, played one after the other; a new round drops the
// one before; Stop and Escape silence it. A read-aloud button under each answer sends its text back ("read").
const player = new Audio();
let round = null, silenced = null, queue = [], next = 0;
const status = (what) => { element.dataset.speech = what; element.dataset.played = String(next); };
const playNext = () => {
  if (!player.paused || next >= queue.length) return;
  player.src = queue[next++];
  status("playing");
  player.play().catch(() => status("blocked"));  // a browser that plays nothing before a click on the page
};
player.addEventListener("ended", () => { status("idle"); playNext(); });
const silence = () => {
  player.pause(); silenced = round; queue = []; next = 0; status("stopped");
};
const take = () => {
  const value = props.value || {};
  if (!value.round || value.round === silenced) return;
  if (value.round !== round) { player.pause(); round = value.round; next = 0; }
  queue = value.clips || [];
  playNext();
};
watch("value", take);
document.addEventListener("click", (event) => {
  if (event.target.closest && event.target.closest("button.stop-button")) silence();
}, true);
document.addEventListener("keydown", (event) => { if (event.key === "Escape") silence(); }, true);

const readButton = (message) => {
  const b = document.createElement("button");
  b.type = "button"; b.className = "read-aloud";  // an icon, no text: the answer's innerText stays its own
  b.innerHTML = '<svg width="16" height="16" viewBox="0 0 24 24" fill="none" stroke="currentColor" stroke-width="2">'
    + '<path d="M11 5 6 9H2v6h4l5 4V5z"/><path d="M15.5 8.5a5 5 0 0 1 0 7"/><path d="M19 5a10 10 0 0 1 0 14"/></svg>';
  b.title = "Read aloud"; b.setAttribute("aria-label", "Read aloud");
  b.addEventListener("click", (event) => {
    event.stopPropagation();
    if (!player.paused) { silence(); return; }  // a second click stops it
    const text = message.cloneNode(true);
    text.querySelectorAll(".read-aloud").forEach((x) => x.remove());
    silenced = null;
    props.value = {round: null, clips: [], read: text.innerText, at: Date.now()};
    trigger("read");
  });
  return b;
};
const place = () => {
  const answers = Array.from(document.querySelectorAll('.conversation [data-testid="bot"]'))
    .filter((m) => !m.querySelector(".thought-group") && m.innerText.trim());
  for (const message of answers) if (!message.querySelector(".read-aloud")) message.append(readButton(message));
};
let queued = false;
new MutationObserver(() => {
  if (queued) return;
  queued = true;
  requestAnimationFrame(() => { queued = false; place(); });
}).observe(document.body, {subtree: true, childList: true});
status("idle");
place();
