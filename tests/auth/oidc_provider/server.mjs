// A real OpenID Connect provider for the sign-in tests: panva's oidc-provider (an OpenID-certified
// implementation: discovery, authorize, token, userinfo, JWKS) with a password login form of its own.
// Started by tests/auth/oidc_server.py as `node server.mjs CONFIG.json`; prints "listening URL" when up.
import { generateKeyPairSync, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import Provider from "oidc-provider";

const config = JSON.parse(readFileSync(process.argv[2], "utf8"));
const issuer = `http://127.0.0.1:${config.port}`;
const users = new Map(config.users.map((u) => [u.username, u]));

// A fresh RSA signing key per run: the relying party must fetch it from the JWKS endpoint.
const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
const signingKey = { ...privateKey.export({ format: "jwk" }), kid: "test-key", use: "sig", alg: "RS256" };

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: config.client_id,
      client_secret: config.client_secret,
      redirect_uris: config.redirect_uris,
      grant_types: ["authorization_code"],
      response_types: ["code"],
      token_endpoint_auth_method: "client_secret_post",
    },
  ],
  jwks: { keys: [signingKey] },
  cookies: { keys: [randomBytes(16).toString("hex")] },
  claims: {
    openid: ["sub"],
    email: ["email", "email_verified"],
    profile: ["preferred_username", "name", "given_name", "family_name"],
    groups: ["groups"],
  },
  scopes: ["openid", "email", "profile", "groups"],
  features: { devInteractions: { enabled: false } },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  async findAccount(ctx, id) {
    const user = users.get(id);
    if (!user) return undefined;
    return {
      accountId: id,
      async claims() {
        return {
          sub: id,
          preferred_username: user.username,
          name: user.name,
          email: user.email,
          email_verified: true,
          groups: user.groups,
        };
      },
    };
  },
  // First-party client: the grant covers the requested scopes without a consent page.
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope("openid email profile groups");
    await grant.save();
    return grant;
  },
});

const escape = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

function loginPage(res, uid, error) {
  res.writeHead(error ? 401 : 200, { "content-type": "text/html; charset=utf-8" });
  res.end(`<!doctype html><html lang="en"><head><title>Lab identity provider</title></head><body>
<h1>Lab identity provider</h1>${error ? `<p role="alert">${escape(error)}</p>` : ""}
<form method="post" action="/interaction/${escape(uid)}/login">
<label for="login">Provider username</label><input id="login" name="login" autocomplete="username">
<label for="password">Provider password</label><input id="password" name="password" type="password">
<button type="submit">Sign in to the provider</button></form></body></html>`);
}

async function readForm(req) {
  let body = "";
  for await (const chunk of req) body += chunk;
  return new URLSearchParams(body);
}

async function interaction(req, res) {
  const [, , uid, action] = new URL(req.url, issuer).pathname.split("/");
  const details = await provider.interactionDetails(req, res);
  if (req.method === "GET") return loginPage(res, uid);
  if (action !== "login" || details.prompt.name !== "login") {
    res.writeHead(400).end("unexpected interaction");
    return;
  }
  const form = await readForm(req);
  const user = users.get(form.get("login"));
  if (!user || user.password !== form.get("password")) return loginPage(res, uid, "Wrong username or password.");
  await provider.interactionFinished(req, res, { login: { accountId: user.username } }, { mergeWithLastSubmission: false });
}

const callback = provider.callback();
const server = createServer((req, res) => {
  if (req.url.startsWith("/interaction/")) {
    interaction(req, res).catch((err) => {
      console.error(err);
      if (!res.headersSent) res.writeHead(500);
      res.end(String(err));
    });
    return;
  }
  callback(req, res);
});
server.listen(config.port, "127.0.0.1", () => console.log(`listening ${issuer}`));
