// A real OpenID Connect provider for the SSO end-to-end test (tests/stack/test_sso_login.py):
// panva's oidc-provider on loopback, one confidential client (the Switchyard server under test)
// and the accounts of a JSON file. The file is read at every login, so a test changes a user's
// groups between two logins by rewriting it. The login form is the library's development
// interaction (any password is accepted); tokens are signed RS256 with keys generated at start
// and published at /jwks.
//
// Environment: OP_PORT, OP_CLIENT_ID, OP_CLIENT_SECRET, OP_REDIRECT_URI, OP_ACCOUNTS_FILE.
import { readFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { Provider } from 'oidc-provider';

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} must be set`);
  return value;
};

const port = Number(env('OP_PORT'));
const issuer = `http://127.0.0.1:${port}`;
const accountsFile = env('OP_ACCOUNTS_FILE');

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: env('OP_CLIENT_ID'),
      client_secret: env('OP_CLIENT_SECRET'),
      redirect_uris: [env('OP_REDIRECT_URI')],
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_post',
      id_token_signed_response_alg: 'RS256',
    },
  ],
  // The claims each scope releases; `groups` is the scope an IdP commonly asks for it under.
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['preferred_username', 'name'],
    groups: ['groups'],
  },
  cookies: { keys: [randomBytes(32).toString('hex')] },
  async findAccount(ctx, id) {
    const accounts = JSON.parse(readFileSync(accountsFile, 'utf8'));
    const account = accounts[id];
    if (!account) return undefined;
    return { accountId: id, async claims() { return { sub: id, ...account }; } };
  },
});

provider.listen(port, '127.0.0.1', () => {
  console.log(`oidc-provider listening on ${issuer}`);
});
