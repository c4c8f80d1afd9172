// Downloads a model repository with the official client's snapshotDownload, as a user of @huggingface/hub would:
//   node snapshot.cjs REPO REVISION CACHE_DIR
// HUB_JS is the directory @huggingface/hub is installed in (bin/npm), HF_ENDPOINT the Hub, HF_TOKEN the token if
// any. The snapshot directory is printed on the last line.
const path = require("node:path");
const { snapshotDownload } = require(path.join(process.env.HUB_JS, "node_modules", "@huggingface", "hub"));

snapshotDownload({
	repo: process.argv[2],
	revision: process.argv[3],
	cacheDir: process.argv[4],
	hubUrl: process.env.HF_ENDPOINT,
	accessToken: process.env.HF_TOKEN || undefined,
}).then(
	(dir) => console.log(dir),
	(err) => {
		console.error(err);
		process.exit(1);
	},
);
