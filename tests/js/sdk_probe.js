// A browser app on another origin using the official openai JS SDK against the Videos API
// (tests/test_videos_api_browser.py bundles it with esbuild as the global `sdkProbe`): create a
// video, poll it reading openai-poll-after-ms, download it whole and as a suffix range.
import OpenAI from "openai";

const ACTIVE = ["queued", "in_progress"];

async function sha256(buffer) {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", buffer));
  return Array.from(digest, (byte) => byte.toString(16).padStart(2, "0")).join("");
}

export async function run(baseURL, apiKey, body) {
  const client = new OpenAI({ baseURL, apiKey, dangerouslyAllowBrowser: true, maxRetries: 0 });
  const created = await client.videos.create(body);
  const statuses = [created.status];
  const pollAfter = [];
  let video = created;
  while (ACTIVE.includes(video.status)) {
    const { data, response } = await client.videos.retrieve(created.id).withResponse();
    video = data;
    statuses.push(video.status);
    if (ACTIVE.includes(video.status)) {
      pollAfter.push(response.headers.get("openai-poll-after-ms"));
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
  const whole = await client.videos.downloadContent(created.id);
  const mp4 = await whole.arrayBuffer();
  const tail = await client.videos.downloadContent(created.id, { variant: "video" }, { headers: { Range: "bytes=-100" } });
  const tailBytes = await tail.arrayBuffer();
  const listed = await client.videos.list({ limit: 5 });
  return {
    id: created.id,
    statuses: [...new Set(statuses)],
    pollAfter: [...new Set(pollAfter)],
    size: video.size,
    seconds: video.seconds,
    mp4Bytes: mp4.byteLength,
    mp4Sha256: await sha256(mp4),
    tailStatus: tail.status,
    tailRange: tail.headers.get("content-range"),
    tailSha256: await sha256(tailBytes),
    listedIds: listed.data.map((item) => item.id),
  };
}
