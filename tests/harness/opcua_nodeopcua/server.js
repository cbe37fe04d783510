// One node-opcua test server, run until killed (tests/harness/opcua_nodeopcua.py starts it).
//
// Its settings come as a JSON file named by the only argument: port, applicationUri, name,
// pki (a folder for node-opcua's certificate store), ready (a file written with the endpoint
// URL once the server listens) and, for a secured server, certificate (DER), privateKey (PEM)
// and trust (client certificates, DER, put in the store's trusted list). A secured server
// offers Basic256Sha256 SignAndEncrypt only and refuses any other client certificate, as
// node-opcua does by default; an unsecured one offers security None only. Discovery services
// (FindServers, GetEndpoints) answer over security None either way, as node-opcua's do.
"use strict";

const fs = require("fs");
const opcua = require("node-opcua");

async function main() {
  const settings = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
  const secured = settings.certificate !== undefined;
  const store = new opcua.OPCUACertificateManager({
    rootFolder: settings.pki,
    automaticallyAcceptUnknownCertificate: false,
  });
  await store.initialize();
  for (const path of settings.trust || []) {
    await store.trustCertificate(fs.readFileSync(path));
  }
  const server = new opcua.OPCUAServer({
    port: settings.port,
    hostname: "127.0.0.1",
    serverCertificateManager: store,
    ...(secured
      ? {
          certificateFile: settings.certificate,
          privateKeyFile: settings.privateKey,
          securityPolicies: [opcua.SecurityPolicy.Basic256Sha256],
          securityModes: [opcua.MessageSecurityMode.SignAndEncrypt],
        }
      : {
          securityPolicies: [opcua.SecurityPolicy.None],
          securityModes: [opcua.MessageSecurityMode.None],
        }),
    registerServerMethod: opcua.RegisterServerMethod.HIDDEN, // no LDS is looked for
    serverInfo: {
      applicationUri: settings.applicationUri,
      applicationName: { text: settings.name },
    },
  });
  await server.initialize();
  await server.start();
  fs.writeFileSync(settings.ready, server.getEndpointUrl());
  console.log(`listening on ${server.getEndpointUrl()}`);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
