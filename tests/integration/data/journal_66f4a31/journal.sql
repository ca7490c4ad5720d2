BEGIN TRANSACTION;
CREATE TABLE "events" (
   "seq" INTEGER PRIMARY KEY,
   "ts" REAL NOT NULL,
   "kind" TEXT NOT NULL,
   "payload" TEXT NOT NULL,
   "route" TEXT,
   "principal" TEXT
);
INSERT INTO "events" VALUES(1,1.79620867268591618542e+09,'redsyn_announce','{"agent":"acme/general/joel/echo","node":"acme/general/joel:laptop","listening":true}',NULL,NULL);
INSERT INTO "events" VALUES(2,1.79620867269084310527e+09,'chat','{"sender":"acme/general/sam/desk","target":"acme/general/joel/echo","type":"chat","payload":"ping","timestamp":1796208672.690843,"client_timestamp":1796208672.6896,"hub_id":"test-hub","msg_id":1,"seq":2}','{"recipients":[]}','open-host:127.0.0.1');
INSERT INTO "events" VALUES(3,1.79620867269270539281e+09,'redsyn_take','{"agent":"acme/general/joel/echo","node":"acme/general/joel:laptop","ids":["chat.2"],"lease_until":1796209572.6927054}',NULL,NULL);
INSERT INTO "events" VALUES(4,1.79620867269792938237e+09,'redsyn_message','{"envelope":{"v":1,"id":"echo-1","kind":"reply","from":"acme/general/joel/echo#s1","to":"acme/general/sam/desk","thread":"chat.2","reply_to":"chat.2","ts":1796208672,"ttl":86400,"expires":1796295072,"body":{"type":"text/plain","text":"PONG"},"refs":[],"error":false,"signed":false},"person":"acme/general/joel","node":"acme/general/joel:laptop","digest":"380a36da23e4602189a81fa36c2e7b70b0735f09d2a8f1bb31025bb8134b879c","size":127,"deliveries":[],"closes":{"id":"chat.2","agent":"acme/general/joel/echo"},"to_seat":"acme/general/sam/desk"}',NULL,NULL);
INSERT INTO "events" VALUES(5,1.79620867269792938237e+09,'chat','{"type":"chat","target":"acme/general/sam/desk","payload":"PONG","redsyn":{"id":"echo-1","kind":"reply","from":"acme/general/joel/echo#s1","thread":"chat.2","reply_to":"chat.2","ts":1796208672,"error":false,"refs":[],"signed":false},"sender":"acme/general/joel/echo","timestamp":1796208672.6979294,"hub_id":"test-hub","msg_id":2,"seq":5}','{"recipients":["acme/general/sam/desk"],"redsyn":1}',NULL);
INSERT INTO "events" VALUES(6,1.79620867270305562025e+09,'redsyn_message','{"envelope":{"v":1,"id":"to-ws-1","kind":"request","from":"acme/general/ana/cli#s1","to":"acme/general/sam/desk","thread":"to-ws-1","reply_to":null,"ts":1796208672,"ttl":86400,"expires":1796295072,"body":{"type":"text/plain","text":"hello seat"},"refs":[],"error":false,"signed":false},"person":"acme/general/ana","node":"acme/general/ana:laptop","digest":"a36b403a3ba514327556c284f45727b278a83d57005d712732b6d9cd1c39c513","size":144,"deliveries":[],"to_seat":"acme/general/sam/desk"}',NULL,NULL);
INSERT INTO "events" VALUES(7,1.79620867270305562025e+09,'chat','{"type":"chat","target":"acme/general/sam/desk","payload":"hello seat","redsyn":{"id":"to-ws-1","kind":"request","from":"acme/general/ana/cli#s1","thread":"to-ws-1","ts":1796208672,"error":false,"refs":[],"signed":false},"sender":"acme/general/ana/cli","timestamp":1796208672.7030556,"hub_id":"test-hub","msg_id":3,"seq":7}','{"recipients":["acme/general/sam/desk"],"redsyn":1}',NULL);
INSERT INTO "events" VALUES(8,1.79620867270711946487e+09,'chat','{"sender":"acme/general/sam/desk","target":"acme/general/ana/cli","type":"chat","payload":"hello agent","timestamp":1796208672.7071195,"client_timestamp":1796208672.706033,"hub_id":"test-hub","msg_id":4,"seq":8}','{"recipients":[]}','open-host:127.0.0.1');
INSERT INTO "events" VALUES(9,1.79620867270881891253e+09,'redsyn_take','{"agent":"acme/general/ana/cli","node":"acme/general/ana:laptop","ids":["chat.8"],"lease_until":1796209572.708819}',NULL,NULL);
INSERT INTO "events" VALUES(10,1.79620867271230554582e+09,'broker_session','{"client":"claude","cliSessionId":"old-1","handle":"claude-1","display":null,"title":null,"host":{"hostPid":7,"hostStart":1},"transcriptPath":null,"cwd":null,"pinned":false,"state":"online"}',NULL,'broker');
INSERT INTO "events" VALUES(11,1.7962086727140097618e+09,'chat','{"sender":"acme/general/sam/desk","target":"local/claude-1","type":"chat","payload":"to the handle","timestamp":1796208672.7140098,"client_timestamp":1796208672.7136931,"hub_id":"test-hub","msg_id":5,"seq":11}','{"recipients":["local/claude-1"]}','open-host:127.0.0.1');
INSERT INTO "events" VALUES(12,1.7962086727140097618e+09,'broker_message','{"id":1,"threadId":1,"seq":1,"from":"acme/general/sam/desk","via":null,"to":["claude-1"],"body":"to the handle","bodyLength":13,"verdict":null,"references":[],"mode":"push","replyTo":null,"subject":"to the handle","fingerprint":null,"counted":false}','{"states":{"claude-1":"sent"}}','open-host:127.0.0.1');
INSERT INTO "events" VALUES(13,1.79620867271546030049e+09,'broker_message','{"id":2,"threadId":1,"seq":2,"from":"claude-1","via":null,"to":["acme/general/sam/desk"],"body":"from the handle","bodyLength":15,"verdict":null,"references":[],"mode":"push","replyTo":1,"subject":null,"fingerprint":"0e052d6a31470ee2f761d409"}','{"states":{"acme/general/sam/desk":"sent"}}','broker');
INSERT INTO "events" VALUES(14,1.79620867271546030049e+09,'chat','{"type":"chat","target":"acme/general/sam/desk","payload":"[murmur m2 from claude-1 | thread 1 #2 | reply to m1]\nfrom the handle\n(reply: a chat to local/claude-1 starting \"m2: \" or \"m2 agree: \" (or disagree, info), or with reply_to \"m2\")","metadata":{"broker":{"messageId":2,"threadId":1,"seq":2,"verdict":null}},"sender":"local/claude-1","timestamp":1796208672.7154603,"hub_id":"test-hub","msg_id":6,"seq":14}','{"recipients":["acme/general/sam/desk"]}','broker');
INSERT INTO "events" VALUES(15,1.79620867271745228771e+09,'chat','{"sender":"acme/general/sam/desk","target":"local/claude-1","type":"chat","payload":"m2 agree: and back","timestamp":1796208672.7174523,"client_timestamp":1796208672.7172012,"hub_id":"test-hub","msg_id":7,"seq":15}','{"recipients":["local/claude-1"]}','open-host:127.0.0.1');
INSERT INTO "events" VALUES(16,1.79620867271745228771e+09,'broker_message','{"id":3,"threadId":1,"seq":3,"from":"acme/general/sam/desk","via":null,"to":["claude-1"],"body":"and back","bodyLength":8,"verdict":"agree","references":[],"mode":"push","replyTo":2,"subject":null,"fingerprint":null,"counted":false}','{"states":{"claude-1":"sent"}}','open-host:127.0.0.1');
INSERT INTO "events" VALUES(17,1.79620867271915268898e+09,'chat','{"sender":"acme/general/sam/desk","target":"p/nobody","type":"chat","payload":"anyone?","timestamp":1796208672.7191527,"client_timestamp":1796208672.7187748,"hub_id":"test-hub","msg_id":8,"seq":17}','{"recipients":[]}','open-host:127.0.0.1');
CREATE TABLE "meta" (
   "key" TEXT PRIMARY KEY,
   "value" TEXT
);
INSERT INTO "meta" VALUES('schema_version','1');
INSERT INTO "meta" VALUES('hub_id','test-hub');
CREATE TABLE principal_tokens (digest TEXT PRIMARY KEY, principal TEXT NOT NULL, label TEXT NOT NULL, created_at REAL NOT NULL, UNIQUE (principal, label));
INSERT INTO "principal_tokens" VALUES('1fa109d5419977dfccb81fa72f8c96641c8e88b1e256797c42b9d0d8c0e8781c','acme/general/ana','laptop',1.7962086718017084598e+09);
INSERT INTO "principal_tokens" VALUES('60e3103bcd1a92b437af41a44c001771b5ac7b4d7f8fc5b5535f07bf660d10e4','acme/general/joel','laptop',1.79620867248090171821e+09);
CREATE TABLE principals (name TEXT PRIMARY KEY, seats TEXT NOT NULL, grants TEXT NOT NULL, created_at REAL NOT NULL);
INSERT INTO "principals" VALUES('acme/general/ana','["acme/general/ana/*"]','{}',1.79620867179690885543e+09);
INSERT INTO "principals" VALUES('acme/general/joel','["acme/general/joel/*"]','{}',1.79620867247518038742e+09);
CREATE TABLE principals_version (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);
INSERT INTO "principals_version" VALUES(1,4);
COMMIT;
