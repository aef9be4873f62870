-- The event store of each compose node (compose.yaml mounts this into postgres's init directory).
CREATE DATABASE crewlet_events_n1 OWNER crewlet;
CREATE DATABASE crewlet_events_n2 OWNER crewlet;
