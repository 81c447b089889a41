-- floor: 15 (additive: release 15 never relies on this constraint; it locks a SKU's stock
-- row, and refuses SKUs without one, before it writes a line)
--
-- A line's SKU has a stock row because every writer locks that row before it inserts the
-- line, and stock rows are never deleted. The foreign key checked it again with one extra
-- query per line inserted, on the hottest statement of the service.
ALTER TABLE reservation_lines DROP CONSTRAINT reservation_lines_sku_fkey;
