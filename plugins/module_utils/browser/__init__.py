"""The post-deploy browser gate: a real Chromium crawls the homepage and every service it links."""
