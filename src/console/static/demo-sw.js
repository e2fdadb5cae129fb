// The browser check's service worker: each push is handed to the open pages (and shown as a
// notification when the user allowed them). Scope: /console/demo/.
self.addEventListener("install", () => self.skipWaiting())
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()))
self.addEventListener("push", (event) => {
  const text = event.data === null ? "(no payload)" : event.data.text()
  event.waitUntil((async () => {
    for (const client of await self.clients.matchAll({ includeUncontrolled: true, type: "window" })) client.postMessage({ push: text })
    if (self.Notification?.permission === "granted") await self.registration.showNotification("autopush-ts", { body: text })
  })())
})
