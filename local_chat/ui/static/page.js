() => {
  // Escape stops the answer that streams (the message box's Stop, shown only then)
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    const stop = Array.from(document.querySelectorAll("button.stop-button")).find((b) => b.offsetParent !== null);
    if (stop) stop.click();
  }, true);  // in the capture phase: the message box handles its own keys
  // on a narrow screen the conversations start closed: the chat and its message box come first
  let tries = 0;
  const timer = setInterval(() => {
    const sidebar = document.querySelector(".sidebar.conversations");
    if (sidebar && window.innerWidth < 700 && sidebar.classList.contains("open")) {
      sidebar.querySelector(".toggle-button").click();
    }
    // on a wide screen the model's details show under its name; on a narrow one they are a tap away
    const details = document.querySelector(".model-line details");
    if (details && window.innerWidth >= 700) details.open = true;
    if ((sidebar && details) || ++tries > 50) clearInterval(timer);
  }, 100);
}
